"""Automatic steps (:class:`_AutoSteps`): where a step begins and ends when the user marks none — one train step
per optimizer update (or per iteration with several optimizers), one eval step per evaluation batch; docs/pytorch.md
has the rules per loop shape."""

from __future__ import annotations

import weakref
from typing import Any

from otelprof.integrations.torch_state import EVAL_PHASE, FETCH, FORWARD, OPTIMIZER, _open_step
from otelprof.runtime import hotpath as hot


def _has_parameters(module: Any) -> bool:
    """A module with parameters (a model, not a loss function)."""
    try:
        return next(module.parameters(), None) is not None
    except Exception:
        return False


class _AutoSteps:
    """Opens steps the user did not mark at the first event of an iteration and closes them at the end of
    ``optimizer.step()``: with an optimizer hooked, the fetch/forward/backward rounds before its ``step()`` are
    one step (gradient accumulation), a **train** step. An **evaluation** forward (module in eval mode, or
    gradients off: ``model.eval()`` / ``torch.no_grad()``) that finds no training work in its step makes it an
    **eval** step (phase ``eval``): the next evaluation forward of the same module (or the next fetch) starts
    the next eval step, and that module's next training forward ends the evaluation and opens a train step.
    Other modules' forwards join the step they find (a loss module, a teacher model run before or after the
    student); an eval step that gets a backward or an optimizer step was training after all and goes back to
    its phase. With several optimizers (``several``) one iteration's updates are one step: an optimizer's
    ``step()`` leaves the step open (``pending``) unless that optimizer is known to end iterations, and the
    iteration ends at its next one's first event — in a step a fetch opened, only the next fetch (a GAN's
    generator update, after the discriminator's, joins the batch's step); in others, any event but another
    optimizer's ``step()`` (optimizers stepping back to back: one per parameter group, an encoder's and a
    decoder's). The step then ends where its work did (:meth:`close`). Without an optimizer, an event of the kind
    that opened the step (a forward of the module that opened it) starts the next one, so an automatic step
    always ends.

    The hooks test the usual case inline (a step open that the event continues) and call :meth:`begin` /
    :meth:`forward` only when they can do something: no step open, or ours open and the event may end it
    (``slow``)."""

    def __init__(self) -> None:
        self.current: hot.StepContext | None = None
        self.leader = ""
        """The kind of event that opened the current step."""
        self.saw_backward = False
        self.saw_work = False
        """A forward, backward or optimizer step (an epoch's last fetch alone opens a step that is dropped)."""
        self.fetcher = 0
        """The serial of the data-loader iterator whose fetch opened the step (0: not a fetch, or unknown)."""
        self.trained = False
        """Training work in the step: a training forward, a backward or an optimizer step."""
        self.eval_module: Any = None
        """The module whose evaluation forward made the current step an eval step; None: not one."""
        self.eval_seen: list[Any] | None = None
        """Other modules with parameters whose evaluation forwards the current eval step holds."""
        self.retagged: str | None = None
        """The phase the current step had before it became an eval step (``retag``)."""
        self.by_optimizer = False
        """An optimizer is hooked (under ``otelprof run``: one exists): its ``step()`` ends steps."""
        self.leader_module: Any = None
        """The module whose forward opened the current step: without an optimizer, its next forward ends it."""
        self.several = False
        """More than one optimizer: given to ``instrument()``, made under ``otelprof run``, or seen stepping."""
        self.pending: Any = None
        """The optimizer whose ``step()`` left the current step open for the iteration's next update, or its end."""
        self.pending_end = 0
        """When that ``step()`` ended."""
        self.not_last: weakref.WeakSet[Any] = weakref.WeakSet()
        """Optimizers whose update another update followed in an iteration: their ``step()`` leaves the step open."""
        self.last: weakref.WeakSet[Any] = weakref.WeakSet()
        """Optimizers whose update ended an iteration (and, not in ``not_last``, always has): theirs ends the step."""
        self.stepped = 0
        """The ``id()`` of the optimizer whose ``step()`` came last (a second one makes ``several``); not the
        optimizer itself, which the loop may drop (and its state with it)."""
        self.loss_step: hot.StepContext | None = None
        self.loss_mark = 0
        """In ``loss_step``, the loss parts (``backward()`` losses) given to updates' own names so far."""
        self.slow = False
        """The hooks must call :meth:`begin` / :meth:`forward` for any event: an eval step or a pending one."""
        self.opens = True
        """Open steps at all: False once a trainer callback is in charge (:meth:`TorchInstrumentation.hand_over`)."""

    def _ours(self) -> bool:
        return self.current is not None and hot._tls.step is self.current

    def begin(self, kind: str, step: hot.StepContext | None, fetcher: int = 0) -> hot.StepContext | None:
        """A fetch, backward or optimizer event, with ``step`` the step open on the thread (None, or ours): end
        ours when ``kind`` starts the next iteration, open one when none is; training work turns an eval step
        back into a train step. ``fetcher``: the serial of the iterator fetching (0: unknown); a step that holds
        only another iterator's fetch goes on (a batch peeked at before the loop, a second loader zipped in).
        Returns the step open afterwards."""
        if step is not None and step is self.current:
            if self.pending is not None:
                if kind == OPTIMIZER:  # another update of the iteration (the pre-hook calls next_update first)
                    self.pending = None
                    self.slow = False
                elif kind == FETCH or self.leader != FETCH:  # the next iteration's first event
                    self.end_iteration()
                    step = hot._tls.step
            elif kind == FETCH:
                if (kind == self.leader and (not self.by_optimizer or not self.saw_backward)
                        and (self.saw_work or not fetcher or not self.fetcher or fetcher == self.fetcher)) \
                        or self.eval_module is not None:
                    self.close()
                    step = hot._tls.step
            elif self.eval_module is not None:
                if kind == OPTIMIZER and not self.trained:  # step(closure) after an evaluation: the closure is the
                    self.close()                             # next iteration's training, a step of its own
                    step = hot._tls.step
                else:  # backward or optimizer step in an eval step: training after all
                    self.untag()
            elif kind == self.leader and not self.by_optimizer:
                self.close()
                step = hot._tls.step
        if step is not None or hot._active is None or not self.opens:
            return step
        step = self.open(kind)
        self.fetcher = fetcher
        return step

    def forward(self, step: hot.StepContext | None, module: Any, evaluating: bool) -> hot.StepContext | None:
        """A forward of ``module`` (``evaluating``: in eval mode or with gradients off), with ``step`` the step
        open on the thread (None, or ours). Returns the step open afterwards."""
        if step is not None and step is self.current:
            if self.pending is not None:
                if self.leader != FETCH:  # a step a fetch opened waits for the next fetch: this forward is its own
                    self.end_iteration()
                    step = hot._tls.step
            elif self.eval_module is not None:  # an eval step
                if module is self.eval_module:
                    if self.leader == FORWARD or not evaluating:
                        self.close()  # that model's next evaluation batch, or its training again
                        step = hot._tls.step
                elif evaluating and self.leader == FORWARD and _has_parameters(module):
                    seen = self.eval_seen
                    if seen is None:
                        self.eval_seen = [module]
                    elif any(m is module for m in seen):
                        self.close()  # another model ran again: the next batch (a model reloaded for the test set)
                        step = hot._tls.step
                    else:
                        seen.append(module)  # a second model of the same batch (a decoder after its encoder)
            elif self.leader == FORWARD and not self.by_optimizer and module is self.leader_module:
                self.close()
                step = hot._tls.step
        if step is None:
            if hot._active is None or not self.opens:
                return None
            step = self.open(FORWARD)
            self.leader_module = module
        if step is self.current:
            if not evaluating:
                self.trained = True
            elif self.eval_module is None and not self.trained:  # the step's first work is evaluation
                self.eval_module, self.eval_seen, self.slow = module, None, True
                if hot._phase[0] == hot.DEFAULT_PHASE:
                    self.retag(EVAL_PHASE)
        return step

    def open(self, kind: str) -> hot.StepContext:
        """Open a step (the data-loader hook does the same inline)."""
        step = hot._begin_step(None)
        self.current, self.leader, self.saw_backward, self.saw_work, self.trained = step, kind, False, False, False
        self.eval_module = self.pending = self.retagged = None
        self.slow = False
        self.fetcher = 0
        return step

    def next_update(self, optimizer: Any, step: hot.StepContext) -> hot.StepContext | None:
        """``optimizer.step()`` begins in the pending step: another update of the iteration (``pending`` does not
        always end iterations), or — the same optimizer again, in a step no fetch opened — the next iteration.
        Returns the step open afterwards."""
        pending = self.pending
        if pending is optimizer and self.leader != FETCH:
            self.end_iteration()
            return self.begin(OPTIMIZER, hot._tls.step)
        self.not_last.add(pending)
        self.pending = None
        self.slow = self.eval_module is not None
        return step

    def end_iteration(self) -> None:
        """The pending step's iteration is over: its last update was the pending optimizer's (learned)."""
        self.last.add(self.pending)
        self.close()

    def close(self) -> None:
        """End the current step; a pending one where its work ended (its last region, or its last update), not at
        the next iteration's first event."""
        step = self.current
        pending, end = self.pending, self.pending_end
        self.eval_module = self.leader_module = self.pending = None
        self.slow = False
        if step is not None:
            self.current = None
            if hot._tls.step is step:
                if pending is None:
                    step.__exit__(None, None, None)
                else:
                    annotations = step.annotations
                    hot._end_step(step, max(end, annotations[-1][2]) if annotations else end)

    def cancel(self) -> None:
        """Drop a step that only saw the fetch that ended the epoch."""
        step = self.current
        if step is None:
            return
        if not self.saw_work and _open_step() is step:
            self.current = None
            self.eval_module = self.pending = None
            self.slow = False
            step.closed = True
            hot._tls.step = step._previous
            if hot._step_numbers.get(step.phase) == step.number + 1:
                hot._step_numbers[step.phase] = step.number

    def retag(self, phase: str) -> None:
        """Move the open auto step to ``phase`` (evaluation detected), numbered in that phase."""
        step = self.current
        if step is None or not self._ours() or step.phase == phase:
            return
        if self.retagged is None:
            self.retagged = step.phase
        if hot._step_numbers.get(step.phase) == step.number + 1:
            hot._step_numbers[step.phase] = step.number
        step.phase = phase
        step.number = hot._step_numbers.get(phase, 0)
        hot._step_numbers[phase] = step.number + 1

    def untag(self) -> None:
        """The eval step got training work (a backward, an optimizer step): it is a train step after all."""
        self.eval_module = None
        self.slow = self.pending is not None
        phase, self.retagged = self.retagged, None
        if phase is not None:
            self.retag(phase)
            self.retagged = None
