"""The evidence: what says a patch is still needed, works, or has landed. It owns running each
patch's proof red on the pristine base and green patched (prove; a run's outcome read from its
pytest, outcome; the tree a pristine run has and the red its proof declares, pristine; in the
interpreter proofenv builds, with the TransformerEngine site of tesite and the pytest plugin in ``proofsite/``, put on
the proof's path as a folder, not imported), bisecting a failure over the series (bisect), which
patches a new base already has (retire), moving patches onto a new base (rebase) and the canary
against each upstream's main (canary). It may import the core, carry.series and carry.workspace,
never carry.images, carry.nightly or carry.commands."""
