"""Put on a proof interpreter's path by carry.prove: ``carry_proof_plugin``, the pytest plugin
that records how far a proof got (carry.prove tells an environment error from a red proof by it)."""
