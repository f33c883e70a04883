"""Put on a proof interpreter's path by carry.evidence.prove: ``carry_proof_plugin``, the pytest plugin
that records how far a proof got (carry.evidence.prove tells an environment error from a red proof by it)."""
