"""Put first on PYTHONPATH by ``watchdog run``: runs the sitecustomize it shadows, if
any, then instruments this process if it is a rank (``watchdog.hook.zero_code.auto``).

Nothing here may break the user's program: every failure is swallowed (auto
prints one line for its own). The directory has no __init__.py: it is not a
package, only a place Python looks for ``sitecustomize``.
"""

import sys


def _instrument() -> None:
    try:
        from watchdog.hook.zero_code import auto
    except Exception:  # watchdog not importable by this interpreter: run the script as is
        return
    auto.bootstrap()


def _chain() -> None:
    """Import the next ``sitecustomize`` on sys.path (a distribution's or the user's)."""
    import importlib
    import os

    here = os.path.dirname(os.path.abspath(__file__))
    saved_path, saved_mod = list(sys.path), sys.modules.pop("sitecustomize", None)
    try:
        sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
        importlib.import_module("sitecustomize")
    except ImportError:
        pass
    except Exception as exc:  # theirs failed: Python would print this and carry on, so do we
        print(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{exc!r}", file=sys.stderr)
    finally:
        sys.path[:] = saved_path
        if saved_mod is not None:
            sys.modules["sitecustomize"] = saved_mod


try:
    _chain()  # theirs first: it may set up the paths torch is found on
finally:
    _instrument()
