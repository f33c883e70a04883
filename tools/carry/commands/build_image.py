"""gtp-carry build-image / tools/build_image.py."""

from __future__ import annotations

import time
from pathlib import Path

from .. import progress, report
from ..errors import CarryError
from ..images.build import BuildOptions, build_image
from ..images.config import load_image
from ..series.repo import REPO_ROOT, load_series
from . import options

DESCRIPTION = """\
Build images/IMAGE for real: apply the series, write the patched wheels, lay out the
build context and run `docker build` (BuildKit), tagged by a hash of every input.
An image with that tag already there is not rebuilt. The built image is verified
(its CMD): patched wheels present, TE and HAVE_GTP as the flavour demands, series
digest equal to the labels'."""


def main(argv: list[str], prog: str) -> int:
    p = options.parser(prog, DESCRIPTION)
    p.add_argument("image", help="an image folder under images/ (e.g. gtp-te219)")
    p.add_argument("--flavor", required=True, help="a flavour from the image's image.toml: cpu or cuda")
    options.add_series(p, default_note="the series the image.toml names")
    p.add_argument("--base", help="base image reference (default: the flavour's base in image.toml)")
    p.add_argument("--te-version", help="TransformerEngine version (default: image.toml's [te] version)")
    p.add_argument("--tag", action="append", default=[], metavar="NAME[:TAG]",
                   help="also tag the image so (the content-addressed tag is always set)")
    p.add_argument("--repository", help="repository of the content-addressed tag (default: the image name)")
    options.add_json(p)
    p.add_argument("--squashfs", type=Path, metavar="OUT", help="also export the image as squashfs (enroot/pyxis)")
    p.add_argument("--wheelhouse", type=Path, metavar="DIR",
                   help="use these patched wheels (tools/apply.py --wheels DIR) instead of applying the series")
    p.add_argument("--context-only", type=Path, metavar="DIR",
                   help="write the build context (Dockerfile, steps, wheelhouse/ with image.env) to DIR and stop;"
                        " no Docker needed (for steps/run-local.sh on a machine without Docker)")
    p.add_argument("--workdir", type=Path, help="apply workspaces (default: CACHE/images/work/SERIES)")
    options.add_cache(p)
    p.add_argument("--ca-bundle", metavar="FILE|none",
                   help="CA bundle passed to the build as a secret (default: the one pip is configured with)")
    p.add_argument("--log", type=Path, metavar="FILE", help="where the build log goes (default: under the cache)")
    a = p.parse_args(argv)
    cfg = load_image(REPO_ROOT, a.image)
    cfg.flavor(a.flavor)  # an unknown flavour is a usage error before anything runs
    series = load_series(a.series or cfg.series)
    cache = options.cache(a)
    opts = BuildOptions(
        image=a.image, flavor=a.flavor, series=series, repo_root=REPO_ROOT, cache=cache,
        workdir=a.workdir or cache / "images" / "work" / series.name, repository=a.repository, tags=a.tag,
        base=a.base, te_version=a.te_version, wheelhouse=a.wheelhouse, squashfs=a.squashfs,
        ca_bundle=a.ca_bundle, log=a.log, context_dir=a.context_only)
    t0 = time.monotonic()
    try:
        res = build_image(opts)
    except CarryError as exc:
        options.write_report(a.json, {"ok": False, "image": a.image, "flavor": a.flavor, "error": exc.message,
                                      "kind": type(exc).__name__})
        raise
    options.write_report(a.json, res)
    if a.context_only:
        print(f"context for {a.image} ({a.flavor}) written to {res['context']}")
        print(f"run the steps outside Docker: bash {res['context']}/steps/run-local.sh "
              f"--wheelhouse {res['context']}/wheelhouse --venv VENV")
        return 0
    built = res.get("built")
    print(f"{res['tags'][0]}: " + ("built" if built else "up to date, not rebuilt")
          + f" in {time.monotonic() - t0:.1f}s ({(res.get('image_id') or '')[:19]})")
    if built:
        rows = [[s["name"][:70], "cached" if s["cached"] else (f"{s['seconds']:.1f}s" if s["seconds"] else "-")]
                for s in res["steps"]]
        print(report.table(rows, ["step", "result"]))
    v = res["verify"]
    for venv in v["venvs"]:
        print(f"  {venv['venv']}: megatron-core {venv['megatron_core']}, TE {venv['transformer_engine'] or '-'}, "
              f"HAVE_GTP {venv['have_gtp']}" + (f" ({venv['have_gtp_reason']})" if venv["have_gtp_reason"] else ""))
    if res.get("squashfs"):
        print(f"squashfs: {res['squashfs']['path']} ({res['squashfs']['bytes'] / 1e6:.1f} MB)")
    progress.say("done")
    return 0

