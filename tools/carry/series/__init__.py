"""The series: what is carried, as files: ``series.toml`` (carry.series.manifest, its entries
checked by carry.series.entries), the patch files (patchfile), their lint, the text edits that
retire and rebase make to the manifest (edit), and where this repository keeps its series and how
its commands are spelled in hints (repo). Nothing here touches a workspace; git runs only to read a
patch file as git itself does (patchgit, outside any repository). It may
import only the core (carry.errors, carry.files, carry.runner, ...), never carry.workspace,
carry.evidence, carry.images, carry.nightly or carry.commands."""
