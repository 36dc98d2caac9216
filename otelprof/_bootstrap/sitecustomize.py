"""Loaded by ``otelprof run`` through PYTHONPATH: start otelprof and hook PyTorch, then hand over to
any other ``sitecustomize`` further down the path. Never stops the program from starting."""

import os
import sys


def _start() -> None:
    try:
        import otelprof

        otelprof.init()
        if os.environ.get("OTELPROF_RUN_TORCH", "1") != "0":
            try:
                import torch  # noqa: F401
            except ImportError:
                return
            from otelprof.integrations.torch import auto_instrument

            auto_instrument(grad_norm=os.environ.get("OTELPROF_RUN_GRAD_NORM") == "1")
    except Exception as exc:  # the training program must start regardless
        sys.stderr.write(f"otelprof: automatic instrumentation failed: {exc!r}\n")


def _chain() -> None:
    """Run the next sitecustomize on sys.path, the one ours shadows."""
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        if not entry or os.path.abspath(entry) == here:
            continue
        candidate = os.path.join(entry, "sitecustomize.py")
        if os.path.isfile(candidate):
            spec = importlib.util.spec_from_file_location("_otelprof_next_sitecustomize", candidate)
            if spec is not None and spec.loader is not None:
                try:
                    spec.loader.exec_module(importlib.util.module_from_spec(spec))
                except Exception as exc:
                    sys.stderr.write(f"otelprof: the original sitecustomize failed: {exc!r}\n")
            return


def _is_training_process() -> bool:
    """Not a launcher (torchrun) and not a multiprocessing helper (DataLoader workers with spawn)."""
    argv = list(getattr(sys, "orig_argv", sys.argv))
    text = " ".join(argv)
    if "--multiprocessing-fork" in text or ("multiprocessing" in text and "-c" in argv):
        return False
    launcher = ("torch.distributed.run", "torch.distributed.launch", "torchrun")
    return not any(os.path.basename(a) in launcher or a in launcher for a in argv[:4])


if os.environ.get("OTELPROF_RUN") == "1" and _is_training_process():
    _start()
_chain()
