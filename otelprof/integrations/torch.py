"""PyTorch in one line: ``otelprof.integrations.torch.instrument(model=..., optimizer=..., dataloader=...)``.

What each region measures. Regions are host time, i.e. what the Python training loop waits for; on CPU
that is the work itself, on CUDA mostly the time to queue the kernels (the GPU runs them later):

* ``dataloader`` — from asking the data loader for the next batch to getting it: input wait.
* ``forward`` — the instrumented module's forward call.
* ``backward`` — ``Tensor.backward()``: the autograd pass (on CUDA, until its kernels are queued).
* ``optimizer`` — ``optimizer.step()`` (the gradient norm, when asked for, is computed just before it).
* ``collective`` — a DDP gradient all-reduce from launch until its future completes (communication hook;
  gloo completes it when the reduction is done, NCCL as soon as it is queued on its stream).

When the model's parameters are on a CUDA device, forward, backward and optimizer also get a device time
(:mod:`otelprof.integrations.cuda_timing`): CUDA events around the region, read once the GPU has passed
them, never waited for; ``otelprof.region.device.duration`` and late ``"k":"d"`` lines in the recording.
On CPU there is no timer at all (one attribute check per hook).

Steps: when the user marks none, a train step runs from the first event of an iteration (batch fetch,
forward) to the end of ``optimizer.step()`` — with gradient accumulation, one step per optimizer
update; with several optimizers, one step per iteration (a GAN's two updates per batch) — and each evaluation
batch (forwards in eval mode or without gradients) is an eval step (:mod:`~otelprof.integrations.torch_steps`;
docs/pytorch.md has the rules per loop shape). Scalars: the loss (a train step's: the sum of the scalar tensors given to
``backward()``, a ``GradScaler``'s scale undone, only the first evaluation's inside ``step(closure)``, and with
several optimizers each update's also under its optimizer's name; an eval step's: the mean of the scalar losses
its forwards returned), the learning rate, optionally the global gradient norm,
samples per step (the first dimension of the batch), CUDA memory when CUDA is used.

A hook that raises is removed and counted (``otelprof_integration_errors_total``); training goes on.

Where the C extension ``_torch_native`` is built (``OTELPROF_TORCH_NATIVE``, default on), the four per-step
hooks are its C objects: they keep the plain automatic step in C and leave everything else to the Python
hooks, handing a step they hold over first (:meth:`TorchInstrumentation._materialise`). Both give
the same recording; :meth:`TorchInstrumentation.sync_native` says when the C path applies.

The code, by responsibility: ``torch_steps`` (automatic steps), ``torch_hooks`` (what every hook of an
instrumentation shares: failure handling, the C hand-over, device timing), one module per region —
``torch_dataloader``, ``torch_forward``, ``torch_backward`` (with ``GradScaler``), ``torch_optimizer``,
``torch_ddp`` — ``torch_scalars`` (samples, loss, learning rate, CUDA memory), ``torch_subclass`` (timed classes
that pickle as the original) and ``torch_state`` (what they all share); this module puts the hook families
together as :class:`TorchInstrumentation` and holds the public functions.
"""

from __future__ import annotations

import atexit
import contextlib
import sys
from typing import Any

from otelprof._log import warn_once
from otelprof.integrations import torch_backward, torch_compile, torch_profiler
from otelprof.integrations.torch_backward import _patch_backward, _unpatch_backward
from otelprof.integrations.torch_dataloader import _LoaderHooks, _patch_dataloader_class, _unpatch_dataloader_class
from otelprof.integrations.torch_ddp import _patch_ddp_class, _unpatch_ddp_class
from otelprof.integrations.torch_forward import _ModelHooks
from otelprof.integrations.torch_optimizer import _OptimizerHooks, _patch_optimizer_class, _unpatch_optimizer_class
from otelprof.integrations.torch_state import _active, _lock, _session
from otelprof.runtime import _stop_exit
from otelprof.runtime import hotpath as hot

__all__ = ["TorchInstrumentation", "auto_instrument", "instrument", "profile_window", "uninstrument"]


class TorchInstrumentation(_LoaderHooks, _ModelHooks, _OptimizerHooks):
    """Hooks on one model / optimizer / data loader (or, with ``everything=True``, on all of them): the hook families
    of :mod:`~otelprof.integrations.torch_hooks` together, and what concerns all of them (``otelprof run``'s global
    hooks, the hand-over to a trainer's callback, removal)."""

    # ------------------------------------------------------------------ everything (otelprof run)
    def add_everything(self) -> None:
        """Global hooks: every optimizer, every top-level module call, every DataLoader."""
        from torch.nn.modules import module as nn_module
        from torch.optim import optimizer as optim_module

        depth = self._global_depth
        forward_pre, forward_post = self._forward_pre_hook, self._forward_post_hook  # both guarded

        def pre(module: Any, args: Any) -> None:
            level = depth.value
            depth.value = level + 1
            if level == 0:
                forward_pre(module, args)

        def post(module: Any, args: Any, output: Any) -> None:
            level = depth.value - 1
            depth.value = level if level > 0 else 0  # not below 0: a call that began before the hooks did
            if level == 0:
                forward_post(module, args, output)

        # Steps end at optimizer.step() once an optimizer exists (made from now on, or seen stepping): a loop that
        # updates its parameters itself has none, and its steps end at its model's next forward.
        _patch_optimizer_class(self.auto)
        self._on_remove("optimizer", _unpatch_optimizer_class)
        for hook in (pre, post):  # called from eager code under a compiled module: run as written, never compiled
            torch_compile.run_eagerly(hook)
        handles = [nn_module.register_module_forward_pre_hook(pre), nn_module.register_module_forward_hook(post),
                   optim_module.register_optimizer_step_pre_hook(self._optimizer_pre_hook),
                   optim_module.register_optimizer_step_post_hook(self._optimizer_post_hook)]
        module_hooks = ((nn_module._global_forward_pre_hooks, handles[0].id, pre),
                        (nn_module._global_forward_hooks, handles[1].id, post))

        def before_compile() -> None:
            # from the first compilation on (before Dynamo traces anything) the module hooks are traced as nothing
            # (calls inside a compiled graph are no top-level calls); until then they pay no check per module call.
            # The entries are replaced in place: the number of global hooks, which Dynamo guards on, stays.
            for hooks, key, hook in module_hooks:
                if key in hooks:
                    hooks[key] = torch_compile.skipped_while_compiling(hook)

        torch_compile.on_first_compile(before_compile)
        for handle in handles[:2]:
            self._on_remove("forward", handle.remove)
        for handle in handles[2:]:
            self._on_remove("optimizer", handle.remove)
        _patch_dataloader_class()
        self._on_remove("dataloader", _unpatch_dataloader_class)
        self._global_removers = [handle.remove for handle in handles] + [_unpatch_dataloader_class]
        _patch_ddp_class()  # each DDP model built from now on: collective regions
        self._on_remove("collective", _unpatch_ddp_class)
        # torch warns at each call of a torch.compile'd module while global hooks exist that they fire for it too:
        # that is expected here (only top-level calls count), and the training job's stderr stays quiet.
        torch_compile.quiet_global_hooks()
        self._on_remove("forward", torch_compile.unquiet_global_hooks)

    def hand_over(self, framework: str) -> None:
        """A trainer's callback is in charge of steps from now on (``otelprof run`` attached it, see
        :mod:`otelprof.integrations.autoattach`): the global hooks of :meth:`add_everything` stop timing module
        calls, optimizer steps and data-loader fetches, and no step opens automatically or records loss or
        samples — the callback does all that as it does without ``otelprof run``. ``Tensor.backward`` stays
        timed (the callbacks rely on it) and DDP models still get their collective regions."""
        with _lock:
            if self.handed_over or self.closed:
                return
            self.handed_over = framework
            removers, self._global_removers = self._global_removers, []
            for remove in removers:
                with contextlib.suppress(Exception):
                    remove()
            self.auto.close()
            self.auto.opens = False
            self.loss = self.count_samples = False
            self.sync_native()

    # ------------------------------------------------------------------ lifecycle
    def profile_window(self, start_step: int, num_steps: int, *, chrome_trace: bool = False,
                       top: int = 15) -> dict[str, Any]:
        """Run ``torch.profiler`` for steps ``start_step`` .. ``start_step + num_steps - 1``."""
        return self.windows.arm(start_step, num_steps, chrome_trace=chrome_trace, top=top)

    def uninstrument(self) -> None:
        """Remove every hook this instrumentation installed (DDP communication hooks cannot be removed)."""
        with _lock:
            if self.closed:
                return
            self.closed = True
            for hook in list(self._removers):
                self._remove_hook(hook)
            self._close_device_timer()
            native = self.native
            if native is not None:
                self._materialise()  # a step the C hooks hold ends as the Python hooks' would
                native.release()
                self.native = None
            self.auto.close()
            if self in _active:
                _active.remove(self)
            if not _active:
                _unpatch_backward()
            elif torch_backward._native_backward is not None:
                torch_backward._native_backward.steps = _active[-1].native
            session = _session()
            if session is not None and session.capture_handler == self._capture:
                session.capture_handler = None

    def _capture(self, steps: int) -> dict[str, Any]:
        return self.windows.arm(hot.next_step_number(), steps, trigger="capture")


def instrument(
    model: Any = None,
    optimizer: Any = None,
    dataloader: Any = None,
    *,
    grad_norm: bool = False,
    loss: bool = True,
    count_samples: bool = True,
    collections: Any = None,
) -> TorchInstrumentation:
    """Instrument a PyTorch training loop (each argument optional; calling again adds objects).

    ``grad_norm=True`` also records the global gradient norm before each ``optimizer.step()``
    (one norm per parameter tensor: measured in ``benchmarks/``). ``collections`` (names, regex forms or
    :class:`otelprof.tensor_collections.Collection`; default ``OTELPROF_COLLECTIONS``) saves tensor statistics of
    ``model`` (docs/tensors.md). Call ``otelprof.init()`` first."""
    with _lock:
        inst: TorchInstrumentation | None = _active[-1] if _active else None
        if inst is None:
            inst = TorchInstrumentation(grad_norm, loss, count_samples)
            _active.append(inst)
            _patch_backward(inst.native)
            _end_steps_at_exit()
            torch_compile.install()  # compile time as a region; hooks out of the compiler's way
            session = _session()
            if session is not None and hasattr(session, "capture_handler"):
                session.capture_handler = inst._capture
        else:  # one instrumentation per process: what any caller asked for is on
            inst.grad_norm = inst.grad_norm or grad_norm
            inst.loss = inst.loss or loss
            inst.count_samples = inst.count_samples or count_samples
        for part, add, obj in (("model", inst.add_model, model), ("optimizer", inst.add_optimizer, optimizer),
                               ("dataloader", inst.add_dataloader, dataloader)):
            if obj is not None:
                try:
                    add(obj)
                except Exception as exc:  # an object of an unforeseen shape: a warning, never the job's failure
                    warn_once(f"torch:add-{part}", "otelprof: cannot instrument the %s %s (%s: %s); ignored",
                              part, type(obj).__name__, type(exc).__name__, exc)
        inst.sync_native()
        _patch_accelerate()
        _collect_tensors(collections, model, False)
        return inst


def _collect_tensors(collections: Any, model: Any, discover: bool) -> None:
    """Tensor collections (:mod:`otelprof.integrations.tensors`); a failure costs them, never the job."""
    try:
        from otelprof.integrations import tensors

        tensors.collect(collections, model, discover)
    except Exception as exc:
        warn_once("torch:tensors", "otelprof: cannot save tensor collections (%s: %s); ignored",
                  type(exc).__name__, exc)


def _patch_accelerate() -> None:
    """accelerate loaded: the loss passed to ``Accelerator.backward`` is the one recorded (see
    :mod:`otelprof.integrations.accelerate`)."""
    module = sys.modules.get("accelerate.accelerator")
    if module is not None:
        try:
            from otelprof.integrations.accelerate import patch_backward

            patch_backward(module.Accelerator)
        except Exception as exc:
            warn_once("torch:accelerate", "otelprof: cannot patch accelerate (%r); the recorded loss of its "
                      "backward() is the divided one", exc)


_exit_hook: list[bool] = []


def _end_steps_at_exit() -> None:
    """Once per process: at exit, before the session's shutdown (registered earlier, so run later), the automatic
    step still open is recorded — one no event of a next iteration ended: the last evaluation batch of a loop
    without a DataLoader, the last step of a loop without an optimizer."""
    if not _exit_hook:
        _exit_hook.append(True)
        atexit.register(_end_open_steps)


def _end_open_steps() -> None:
    with _lock:
        for inst in list(_active):
            # a stop request at the very end: nothing left to stop
            with contextlib.suppress(hot.StopTraining, _stop_exit.StopExit):
                inst.guarded("optimizer", inst.end_open_step)


def auto_instrument(grad_norm: bool = False) -> TorchInstrumentation:
    """Hook every optimizer, top-level module call and DataLoader in the process (``otelprof run``)."""
    inst = instrument(grad_norm=grad_norm)
    with _lock:
        if "everything" not in inst._removers:
            inst.add_everything()
            inst._removers.setdefault("everything", [])
            inst.sync_native()
    _collect_tensors(None, None, True)
    return inst


def uninstrument() -> None:
    """Remove every hook otelprof installed in PyTorch."""
    with _lock:
        for inst in list(_active):
            inst.uninstrument()
    from otelprof.integrations import tensors

    tensors.stop()
    torch_compile.uninstall()


def profile_window(start_step: int, num_steps: int, *, chrome_trace: bool = False, top: int = 15) -> dict[str, Any]:
    """Profile operators with ``torch.profiler`` for ``num_steps`` steps from ``start_step``. Windows follow the
    steps, however they are marked; this turns no PyTorch hook on (``instrument()`` does, when asked)."""
    return torch_profiler.windows.arm(start_step, num_steps, chrome_trace=chrome_trace, top=top)
