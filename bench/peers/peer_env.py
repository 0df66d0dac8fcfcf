"""What the peer benchmarks share: the PyTorch environment and running a command
that prints one JSON line.

PyTorch comes from PyPI into a virtual environment under the build directory,
never a dependency of the C++ build: BUILD/peer when it exists, else
scripts/python_env.sh makes BUILD/venv-peer (and the caller exits non-zero when
it cannot, e.g. without network)."""
import json
import os
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def peer_python(build, who):
    """The PyTorch environment's python: BUILD/peer if it exists, else scripts/python_env.sh's."""
    existing = os.path.join(build, "peer", "bin", "python")
    if os.path.exists(existing):
        return existing
    made = subprocess.run([os.path.join(ROOT, "scripts", "python_env.sh"), "peer", "torch"],
                          stdout=subprocess.PIPE, check=False, text=True)
    if made.returncode != 0:
        sys.exit(f"{who}: no PyTorch environment (scripts/python_env.sh failed; see above)")
    return made.stdout.strip()


def json_line(cmd, env=None):
    """Runs cmd and returns the JSON object on the last line of its stdout."""
    out = subprocess.run(cmd, stdout=subprocess.PIPE, check=True, text=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])


def best_of(kept, new):
    """new, each rate (a key ending in _gflops or _per_second) the higher and
    each time (a number under a key ending in _seconds) the lower of kept's and
    new's: the best of rounds taken in turn, for a machine whose speed drifts."""
    if kept:
        for key, value in new.items():
            if key.endswith(("_gflops", "_per_second")):
                new[key] = max(value, kept[key])
            elif key.endswith("_seconds") and isinstance(value, (int, float)):
                new[key] = min(value, kept[key])
    return new


def start(build, who):
    """The absolute build directory and the PyTorch environment's python; prints
    lscpu and the load, above every table."""
    build = os.path.abspath(os.path.join(ROOT, build))
    python = peer_python(build, who)
    print(subprocess.run(["lscpu"], stdout=subprocess.PIPE, text=True).stdout.strip())
    print("uptime:", subprocess.run(["uptime"], stdout=subprocess.PIPE, text=True).stdout.strip())
    return build, python
