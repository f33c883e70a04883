"""The command line's verbs: one module per command (``gtp-carry <verb>``, dispatched by carry.cli),
each parsing its options and calling the library, and the option definitions they share
(options), so that an option means the same in every command. It may import every room of the
library (the core, carry.series, carry.workspace, carry.evidence, carry.images, carry.nightly);
nothing in the library imports it."""
