"""The ``forward`` region: the instrumented model's forward, timed through a subclass of its class (module hooks
where that cannot be done); an evaluation forward's loss goes into its eval step."""

from __future__ import annotations

import functools
from time import perf_counter_ns
from typing import Any

import torch

from otelprof._log import warn_once
from otelprof.integrations import torch_compile
from otelprof.integrations.torch_ddp import _CollectiveHooks
from otelprof.integrations.torch_hooks import _Undecided
from otelprof.integrations.torch_scalars import _add_eval_loss, _output_loss
from otelprof.integrations.torch_state import _FORWARD, FORWARD, _grad_enabled, _native
from otelprof.integrations.torch_subclass import _instrumented_subclass, _set_class
from otelprof.runtime import hotpath as hot


class _ModelHooks(_CollectiveHooks):
    """The model hooks of an instrumentation (a DDP model also gets the collective region)."""

    def _forward_pre_hook(self, module: Any, args: Any) -> None:
        """Before the model's forward: may open a step (see _AutoSteps), begins the ``forward`` region."""
        try:
            auto = self.auto
            step = hot._tls.step
            if step is None or step is auto.current:
                step = auto.forward(step, module, not module.training or not _grad_enabled())
            auto.saw_work = True
            timer = self.device_timer
            if timer is not None:
                if isinstance(timer, _Undecided):
                    timer = self._decide_device_timer(module)
                if timer is not None:
                    timer.poll()  # once per iteration: resolve what the GPU has finished, never wait
                    timer.begin(_FORWARD)
            if step is None:  # hot._begin_region inline
                self._forward_regions.append((perf_counter_ns(), None, 0))
            else:
                depth = step.depth
                step.depth = depth + 1
                self._forward_regions.append((perf_counter_ns(), step, depth))
        except hot.StopTraining:
            raise
        except Exception as exc:
            self.failed("forward", exc)

    def _forward_post_hook(self, module: Any, args: Any, output: Any) -> None:
        """After the model's forward: ends the ``forward`` region; an evaluation forward's loss, when its output
        holds one, goes into an evaluation step (see :func:`_output_loss`)."""
        try:
            regions = self._forward_regions
            if regions:
                start, step, depth = regions.pop()
                hot._end_region(_FORWARD, start, step, depth)
                if (self.loss and step is not None and step.phase != hot.DEFAULT_PHASE and module is not None
                        and (not module.training or not _grad_enabled())
                        and (loss := _output_loss(output)) is not None):
                    _add_eval_loss(step, loss)
            timer = self.device_timer
            if timer is not None:
                timer.end(_FORWARD)
        except hot.StopTraining:
            raise
        except Exception as exc:
            self.failed("forward", exc)

    def forward_begin(self, module: Any) -> None:
        """What the forward pre-hook does (a failure removes the forward hooks)."""
        self._forward_pre_hook(module, ())

    def forward_end(self, module: Any = None, output: Any = None) -> None:
        """What the forward hook does (a failure removes the forward hooks)."""
        self._forward_post_hook(module, (), output)

    def add_model(self, model: Any) -> None:
        if model in self.models:
            return
        if not isinstance(model, torch.nn.Module):
            warn_once("torch:model", "otelprof: instrument(model=...) expects a torch.nn.Module, got %s; ignored",
                      type(model).__name__)
            return
        if not self._wrap_forward(model):
            # hooks of a model that torch.compile traces later (compiled after instrument()) are traced as nothing
            pre = model.register_forward_pre_hook(torch_compile.skipped_while_compiling(self._forward_pre_hook))
            try:
                post = model.register_forward_hook(torch_compile.skipped_while_compiling(self._forward_post_hook))
            except Exception:
                pre.remove()
                raise
            self._on_remove("forward", pre.remove)
            self._on_remove("forward", post.remove)
            self._hooked_models += 1
        else:
            self._wrapped_models += 1
        self.models.add(model)
        self._add_comm_hook(model)

    def _wrap_forward(self, model: Any) -> bool:
        """Time ``model``'s forward through a subclass of its class whose ``forward`` runs the two hooks around
        the original, made the model's class until uninstrumented. Module hooks would do the same, but a module
        with hooks takes torch's slow call path (about a fifth of the integration's cost per step on the
        benchmarks' loops), and hooks that hold this instrumentation would make the model impossible to pickle
        or deep-copy. The subclass pickles and copies as the original class, uninstrumented. False when that
        cannot be done (an instance-level ``forward``, a class that refuses the change): then hooks."""
        cls = type(model)
        if "forward" in vars(model) or getattr(cls, "_otelprof_instrumented", False):
            return False
        original = cls.forward
        pre, post = self._forward_pre_hook, self._forward_post_hook
        owner = self

        def forward(this: Any, *args: Any, **kwargs: Any) -> Any:
            # The hooks' usual case inline — a step open that a forward does not end, a module in training mode,
            # no device timer — and the hooks themselves otherwise: on the training thread each call counts.
            region: tuple[hot.StepContext, int, int] | None = None
            hooked = False
            output = None
            try:
                step = hot._tls.step
                auto = owner.auto
                if (step is None or owner.device_timer is not None or not this.training or not _grad_enabled()
                        or (step is auto.current and (auto.leader == FORWARD or auto.slow))):
                    hooked = True
                    pre(this, args)
                else:
                    auto.saw_work = auto.trained = True
                    depth = step.depth
                    step.depth = depth + 1
                    region = (step, depth, perf_counter_ns())
            except hot.StopTraining:
                raise
            except Exception as exc:
                owner.failed("forward", exc)
            try:  # without keyword arguments (the usual model(x)) a plain call: unpacking them costs more
                output = original(this, *args, **kwargs) if kwargs else original(this, *args)
                return output
            finally:
                if region is not None:
                    try:
                        step, depth, start = region
                        end = perf_counter_ns()  # hot._end_region inline
                        if step is not None:
                            step.depth = depth
                            if not step.closed and len(annotations := step.annotations) < hot.MAX_STEP_ANNOTATIONS:
                                annotations.append((_FORWARD, start, end, depth, None))
                            else:
                                hot._close_region(_FORWARD, start, end, step, depth, None)
                        else:
                            hot._close_region(_FORWARD, start, end, None, 0, None)
                    except Exception as exc:
                        owner.failed("forward", exc)
                elif hooked:
                    post(this, args, output)

        timed = forward if self.native is None else _native.Forward(self.native, original, forward)
        is_compiling = torch.compiler.is_compiling

        @functools.wraps(original)  # its signature and name
        def traceable(this: Any, *args: Any, **kwargs: Any) -> Any:
            # What torch.compile sees of the instrumented model (compiled after instrument()): the original
            # forward alone, as the compiler traces this as a constant True (compiled code runs no timing; the C
            # object, which torch.compile(model) itself inspects, has no Python source at all)
            if is_compiling():
                return original(this, *args, **kwargs)
            return timed(this, *args, **kwargs) if kwargs else timed(this, *args)

        traceable.timed = timed  # type: ignore[attr-defined]
        subclass = _instrumented_subclass(cls, {"forward": traceable})
        try:
            _set_class(model, subclass)
        except (TypeError, AttributeError):
            return False

        def restore() -> None:
            if type(model) is subclass:
                _set_class(model, cls)

        self._on_remove("forward", restore)
        return True
