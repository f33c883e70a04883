"""The container images of the patched stack (``images/<name>/`` in the repository). It owns an
image's inputs (config, from ``image.toml``), laying out its build context with the patched
wheels and deriving its content-addressed tag (context), the ``docker`` client (docker), and
building and verifying an image (build). It may import the core, carry.series and
carry.workspace, never carry.evidence, carry.nightly or carry.commands."""
