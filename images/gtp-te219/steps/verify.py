#!/usr/bin/env python3
"""Verify a gtp-te219 environment: the last build step, the image's CMD, and
runnable standalone (run-local.sh) -- stdlib only, any Python >= 3.8.

For every venv matched by GTP_VENVS that carries megatron-core it checks, in
that venv's own interpreter:
  * megatron-core (and megatron-bridge where present) are the patched wheels:
    the local version carries the series digest, every installed file matches
    the wheel's RECORD hash, and ``megatron.core`` resolves into the venv;
  * cuda flavour: TransformerEngine >= the floor, nvidia-cudnn-frontend >= its
    floor and megatron-core's own ``gtp_api.HAVE_GTP`` is True;
  * cpu flavour: HAVE_GTP is False for the named reason
    "TransformerEngine not installed" (asked from megatron-core when torch is
    there, otherwise derived from TE's absence and said so).
It also checks that series.json's digest equals GTP_SERIES_DIGEST (the value
the image's labels carry). Exit 0 when everything holds, 1 otherwise.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import subprocess
import sys
import tempfile

NO_TE = "TransformerEngine not installed"

# Runs inside each venv's interpreter; prints one JSON document.
PROBE = r'''
import base64, hashlib, importlib.metadata as md, importlib.util, json, os, platform, sys, sysconfig
out = {"python": platform.python_version(), "purelib": sysconfig.get_paths()["purelib"], "dists": {}}
for name in ("megatron-core", "megatron-bridge", "transformer-engine", "transformer-engine-torch",
             "transformer-engine-cu12", "transformer-engine-cu13", "nvidia-cudnn-frontend", "torch"):
    try:
        out["dists"][name] = md.version(name)
    except md.PackageNotFoundError:
        out["dists"][name] = None

def record_check(name):
    try:
        dist = md.distribution(name)
    except md.PackageNotFoundError:
        return None
    bad, checked = [], 0
    for f in dist.files or []:
        if not f.hash or f.hash.mode != "sha256":
            continue
        path = f.locate()
        try:
            data = open(path, "rb").read()
        except OSError:
            bad.append(str(f) + " (missing)")
            continue
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        checked += 1
        if digest != f.hash.value:
            bad.append(str(f))
    return {"checked": checked, "mismatched": bad[:10], "mismatches": len(bad)}

out["record"] = {n: record_check(n) for n in ("megatron-core", "megatron-bridge")}
try:
    spec = importlib.util.find_spec("megatron.core")
    out["megatron_core_origin"] = spec.origin if spec else None
except Exception as exc:
    out["megatron_core_origin"] = None
out["gtp_api_source"] = bool(out["megatron_core_origin"]) and os.path.exists(
    os.path.join(os.path.dirname(out["megatron_core_origin"]), "tensor_parallel", "gtp_api.py"))

te_error = None
try:
    import transformer_engine
    out["te_import"] = getattr(transformer_engine, "__version__", "unknown")
except ModuleNotFoundError as exc:
    te_error = "not installed" if exc.name and exc.name.startswith("transformer_engine") else repr(exc)
except Exception as exc:
    te_error = repr(exc)
out["te_error"] = te_error

out["torch"] = importlib.util.find_spec("torch") is not None
out["have_gtp"] = None
out["have_gtp_error"] = None
if out["torch"] and out["megatron_core_origin"]:
    try:
        from megatron.core.tensor_parallel import gtp_api
        out["have_gtp"] = bool(gtp_api.HAVE_GTP)
    except Exception as exc:
        out["have_gtp_error"] = repr(exc)[:500]
print(json.dumps(out))
'''


def vtuple(v: str | None) -> tuple:
    """Release part of a version as ints ('2.20.2+abc' -> (2, 20, 2), '2.19.0.dev0' -> (2, 19, 0))."""
    out: list[int] = []
    for part in (v or "").split("+")[0].split("."):
        m = re.match(r"\d+", part)
        if not m:
            break
        out.append(int(m.group()))
        if m.group() != part:
            break
    return tuple(out)


def ge(a: str | None, b: str) -> bool:
    ta, tb = vtuple(a), vtuple(b)
    n = max(len(ta), len(tb))
    return bool(ta) and ta + (0,) * (n - len(ta)) >= tb + (0,) * (n - len(tb))


def venvs(patterns: str) -> list[str]:
    out = []
    for pattern in patterns.split():
        for v in sorted(glob.glob(pattern)):
            if os.access(os.path.join(v, "bin", "python"), os.X_OK) and v not in out:
                out.append(v)
    return out


def cuda_stub_env() -> dict:
    """During `docker build` there is no GPU driver; CUDA images ship a stub
    libcuda for linking. Point the loader at it so TE can be imported (and
    HAVE_GTP asked); nothing is executed on a GPU."""
    env = dict(os.environ)
    try:
        have_driver = "libcuda.so.1" in subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout
    except OSError:
        have_driver = False
    stub = os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "lib64", "stubs", "libcuda.so")
    if have_driver or not os.path.exists(stub):
        return env
    d = tempfile.mkdtemp(prefix="gtp-cuda-stub.")
    os.symlink(stub, os.path.join(d, "libcuda.so.1"))
    env["LD_LIBRARY_PATH"] = d + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    env["GTP_CUDA_STUB"] = d
    return env


def probe(venv: str, env: dict) -> dict:
    proc = subprocess.run([os.path.join(venv, "bin", "python"), "-c", PROBE], capture_output=True, text=True,
                          env=env, cwd="/", timeout=600)
    if proc.returncode != 0:
        return {"probe_error": (proc.stderr or proc.stdout).strip()[-2000:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def judge(venv: str, p: dict, flavor: str, series: dict, cfg: dict) -> dict:
    problems: list[str] = []
    if "probe_error" in p:
        return {"venv": venv, "ok": False, "problems": ["probe failed: " + p["probe_error"]], "probe": p}
    d = p["dists"]
    want = series["wheels"]
    if d["megatron-core"] != want["megatron-core"]:
        problems.append(f"megatron-core is {d['megatron-core']}, wanted {want['megatron-core']}")
    if d["megatron-bridge"] is not None and d["megatron-bridge"] != want["megatron-bridge"]:
        problems.append(f"megatron-bridge is {d['megatron-bridge']}, wanted {want['megatron-bridge']}")
    for name, rec in p["record"].items():
        if rec and rec["mismatches"]:
            problems.append(f"{name}: {rec['mismatches']} installed file(s) differ from the wheel: "
                            + ", ".join(rec["mismatched"]))
    origin = p.get("megatron_core_origin") or ""
    if not origin.startswith(p["purelib"] + os.sep) and not origin.startswith(venv + os.sep):
        problems.append(f"megatron.core resolves to {origin or 'nothing'}, not into {venv}")
    if not p.get("gtp_api_source"):
        problems.append("megatron/core/tensor_parallel/gtp_api.py is missing")

    te = d["transformer-engine"] or (p.get("te_import") if not p.get("te_error") else None)
    if p.get("have_gtp") is not None:
        have, how = p["have_gtp"], "megatron.core.tensor_parallel.gtp_api.HAVE_GTP"
    elif p.get("have_gtp_error"):
        have, how = False, "importing gtp_api failed: " + p["have_gtp_error"]
    else:
        have, how = False, "derived: no torch in this venv, so megatron-core cannot be imported"
    if have:
        reason = None
    elif p.get("te_error") == "not installed" and not te:
        reason = NO_TE
    elif te and not ge(te, cfg["te_floor"]):
        reason = f"TransformerEngine {te} is below {cfg['te_floor']}"
    elif p.get("te_error"):
        reason = "TransformerEngine does not import: " + p["te_error"]
    else:
        reason = how
    if flavor == "cuda":
        if not ge(te, cfg["te_floor"]):
            problems.append(f"TransformerEngine is {te or 'missing'}, the floor is {cfg['te_floor']}")
        fe = d["nvidia-cudnn-frontend"]
        if cfg.get("cudnn_frontend_floor") and not ge(fe, cfg["cudnn_frontend_floor"]):
            problems.append(f"nvidia-cudnn-frontend is {fe or 'missing'}, TE needs >= {cfg['cudnn_frontend_floor']}")
        if have is not True:
            problems.append(f"HAVE_GTP is not True ({reason})")
    else:
        if have is not False or reason != NO_TE:
            problems.append(f"cpu flavour: wanted HAVE_GTP False because {NO_TE!r}, got {have} ({reason})")
    return {"venv": venv, "ok": not problems, "python": p["python"], "megatron_core": d["megatron-core"],
            "megatron_bridge": d["megatron-bridge"], "transformer_engine": te,
            "nvidia_cudnn_frontend": d["nvidia-cudnn-frontend"], "torch": d["torch"],
            "have_gtp": have, "have_gtp_reason": reason, "have_gtp_source": how,
            "files_checked": sum((r or {}).get("checked", 0) for r in p["record"].values()),
            "problems": problems}


def nemo_rl_check(wheelhouse: str, flavor: str, checkout: str) -> dict:
    """The series' NeMo-RL patches must be in the checkout (cuda); the cpu base has none."""
    folder = os.path.join(wheelhouse, "nemo-rl")
    patches = sorted(f for f in os.listdir(folder) if f.endswith(".patch")) if os.path.isdir(folder) else []
    out = {"checkout": checkout or None, "patches": patches, "applied": [], "missing": [], "note": None}
    if not patches:
        out["note"] = "the series has no nemo-rl patches"
    elif not checkout:
        out["note"] = "no NeMo-RL checkout given: not checked"
    elif flavor == "cpu":
        out["note"] = "cpu flavour: the base has no NeMo-RL checkout, the patches are not applied"
    elif not os.path.isdir(checkout):
        out["missing"] = patches
        out["note"] = f"{checkout} does not exist"
    else:
        differ = _series_differs(checkout, [os.path.join(folder, n) for n in patches])
        if differ is None:
            out["applied"] = patches
        else:
            out["missing"] = patches
            out["note"] = differ
    return out


def _read(path: str) -> bytes | None:
    if not os.path.exists(path):
        return None
    with open(path, "rb") as f:
        return f.read()


def _series_differs(checkout: str, patches: list[str]) -> str | None:
    """None when the checkout's files equal its HEAD with every patch applied in order, else why.

    Patches are checked as a series, not one by one: a patch whose lines a later one changes
    again does not reverse-apply on its own although it is in the tree.
    """
    touched: list[str] = []
    for path in patches:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("+++ b/") and line[6:].strip() not in touched:
                    touched.append(line[6:].strip())
    with tempfile.TemporaryDirectory(prefix="verify-nemo-rl-") as scratch:
        for rel in touched:
            res = subprocess.run(["git", "-C", checkout, "show", f"HEAD:{rel}"], capture_output=True)
            if res.returncode == 0:
                os.makedirs(os.path.dirname(os.path.join(scratch, rel)) or scratch, exist_ok=True)
                with open(os.path.join(scratch, rel), "wb") as f:
                    f.write(res.stdout)
        for path in patches:
            res = subprocess.run(["git", "apply", path], cwd=scratch, capture_output=True, text=True)
            if res.returncode != 0:
                return f"{os.path.basename(path)} does not apply to the checkout's HEAD: {res.stderr.strip()[:200]}"
        for rel in touched:
            if _read(os.path.join(scratch, rel)) != _read(os.path.join(checkout, rel)):
                return f"{rel} differs from HEAD with the series applied"
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--wheelhouse", default=os.environ.get("GTP_WHEELHOUSE", "/opt/gtp/wheelhouse"))
    ap.add_argument("--flavor", default=os.environ.get("GTP_FLAVOR"))
    ap.add_argument("--venvs", default=os.environ.get("GTP_VENVS", "/opt/nemo_rl_venv /opt/ray_venvs/*"))
    ap.add_argument("--te-floor", default=os.environ.get("GTP_TE_FLOOR"))
    ap.add_argument("--cudnn-frontend-floor", default=os.environ.get("GTP_CUDNN_FRONTEND_FLOOR"))
    ap.add_argument("--expect-digest", default=os.environ.get("GTP_SERIES_DIGEST"),
                    help="the series digest the image's labels carry")
    ap.add_argument("--nemo-rl-dir", default=os.environ.get("GTP_NEMO_RL_DIR", "/opt/nemo-rl"),
                    help="the NeMo-RL checkout the series' nemo-rl patches went into ('' = none)")
    ap.add_argument("--target-venvs", default=os.environ.get("GTP_TARGET_VENVS", ""),
                    help="exactly these venvs must carry the patched stack (run-local.sh --venv)")
    ap.add_argument("--json", metavar="FILE", help="also write the report here ('-': only JSON on stdout)")
    a = ap.parse_args(argv)
    if a.flavor not in ("cpu", "cuda") or not a.te_floor:
        ap.error("needs --flavor cpu|cuda and --te-floor (or GTP_FLAVOR, GTP_TE_FLOOR)")
    with open(os.path.join(a.wheelhouse, "series.json")) as f:
        series = json.load(f)
    cfg = {"te_floor": a.te_floor, "cudnn_frontend_floor": a.cudnn_frontend_floor}
    problems: list[str] = []
    if a.expect_digest and a.expect_digest != series["digest"]:
        problems.append(f"series digest {series['digest']} differs from the label's {a.expect_digest}")
    env = cuda_stub_env() if a.flavor == "cuda" else dict(os.environ)
    results, skipped = [], []
    targets = a.target_venvs.split()
    for v in targets or venvs(a.venvs):
        p = probe(v, env)
        if not targets and p.get("dists", {}).get("megatron-core") is None and "probe_error" not in p:
            skipped.append(v)
            continue
        results.append(judge(v, p, a.flavor, series, cfg))
    if not results:
        problems.append(f"no venv in {a.venvs!r} carries megatron-core")
    nrl = nemo_rl_check(a.wheelhouse, a.flavor, a.nemo_rl_dir)
    if nrl["missing"]:
        problems.append(f"NeMo-RL patches not in {a.nemo_rl_dir}: {', '.join(nrl['missing'])}"
                        + (f" ({nrl['note']})" if nrl.get("note") else ""))
    ok = not problems and all(r["ok"] for r in results)
    report = {"ok": ok, "flavor": a.flavor, "series": series["series"], "digest": series["digest"],
              "patches": series["patches"], "wheels": series["wheels"], "te_floor": a.te_floor,
              "cuda_stub": env.get("GTP_CUDA_STUB") is not None, "venvs": results,
              "skipped_venvs": skipped, "nemo_rl": nrl, "problems": problems}
    if a.json and a.json != "-":
        with open(a.json, "w") as f:
            json.dump(report, f, indent=2)
    if a.json == "-":
        print(json.dumps(report, indent=2))
        return 0 if ok else 1
    print(f"gtp-te219 verify ({a.flavor}): series {series['series']} digest {series['digest'][:12]}, "
          f"{len(series['patches'])} patch(es)")
    for r in results:
        mark = "ok " if r["ok"] else "BAD"
        print(f"  {mark} {r['venv']}: python {r.get('python')}, megatron-core {r.get('megatron_core')}, "
              f"megatron-bridge {r.get('megatron_bridge') or '-'}, TE {r.get('transformer_engine') or '-'}, "
              f"HAVE_GTP {r.get('have_gtp')}" + (f" ({r['have_gtp_reason']})" if r.get("have_gtp_reason") else ""))
        for prob in r["problems"]:
            print(f"      problem: {prob}")
    for v in skipped:
        print(f"  -   {v}: no megatron-core (left alone)")
    print(f"  nemo-rl: {len(nrl['patches'])} patch(es), {len(nrl['applied'])} in {nrl['checkout']}"
          + (f" ({nrl['note']})" if nrl["note"] else ""))
    for prob in problems:
        print(f"  problem: {prob}")
    print("VERIFY " + ("OK" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
