"""Tensor collections in PyTorch: weights, gradients, activations ... reduced to statistics at saved steps.

Steps are counted in ``optimizer.step()`` calls (0-based; the first optimizer that steps counts them).
At a step that some collection saves (:mod:`otelprof.tensor_collections`):

* before its forward, forward hooks go on the leaf modules whose ``/output`` or ``/input`` is selected;
  they reduce the tensor of the step's first training forward (in train mode, with gradients: not a
  prediction under ``torch.no_grad()``) on its device at once (the activation itself is not kept) — other
  steps have no such hooks and pay one integer comparison in the optimizer hooks;
* just before ``optimizer.step()`` the selected weights and gradients are reduced (and the weights the
  ``optimizer`` collection follows are copied), just after it the update and its ratio to the weight;
* every reduction of the step is stacked into one tensor and copied off the device without waiting;
  the values are read back (``tolist``) at the first later step whose copy has finished (the next step on a
  CPU), at the next saved step or at exit, appended to ``tensors.jsonl`` (:mod:`otelprof.recording.tensors`)
  and added to the tensor metrics (:mod:`otelprof.integrations.tensor_metrics`).

A hook that raises turns the collections off with one warning; training goes on.

Hooks are never added or removed inside torch's iteration of them: an optimizer's step hooks that have to go
(the collections turned off from inside ``optimizer.step()``, from a hook of the user's for instance) are removed
where torch does not iterate them: a pre hook at the next post hook of a collector, a post hook at the next pre
hook, both at once outside any ``optimizer.step()`` (:func:`_remove_later`); module hooks may go at any time
(torch calls a copy of them).
Under torch.compile (a compiled model, or from the first compilation on) the activation hooks are put on every
selected layer once and stay until the collections close (Dynamo guards on a module's hooks: a hook added or
removed at a saved step would recompile); the compiler traces them as nothing, so the activations of compiled
layers are not seen (counted as dropped at each saved step), those of the layers that run eagerly are.
Tensors of a sparse layout other than COO (CSR, CSC, BSR, BSC) are skipped and counted as dropped.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import math
import re
import threading
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

import torch

from otelprof._log import warn_once
from otelprof.integrations import torch_compile
from otelprof.integrations.tensor_metrics import TensorMetrics
from otelprof.recording import tensors as schema
from otelprof.tensor_checks import Saved
from otelprof.tensor_collections import Collection

_encode_strict = json.JSONEncoder(separators=(",", ":"), check_circular=False, allow_nan=False).encode


def _finite_or_name(value: Any) -> Any:
    """Non-finite floats as the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"`` (as OTLP-JSON writes them)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if value != value else "Infinity" if value > 0 else "-Infinity"
    if isinstance(value, dict):
        return {k: _finite_or_name(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite_or_name(v) for v in value]
    return value


def _encode(record: Any) -> str:
    """One strict JSON line (no ``NaN`` tokens a strict parser refuses)."""
    try:
        return _encode_strict(record)
    except ValueError:  # a non-finite value somewhere: named instead
        return _encode_strict(_finite_or_name(record))

MAX_TENSORS_PER_STEP = 4096
"""Tensors reduced at one saved step at most (the rest are counted as dropped)."""
MAX_CLASSES = 100_000
REDUCED_LAYOUTS = (torch.strided, torch.sparse_coo)
"""Layouts whose tensors are reduced; the other sparse ones (CSR, CSC, BSR, BSC) are skipped and counted as dropped."""
_COMPILED_PREFIX = "_orig_mod"
"""The attribute under which a torch.compile'd module (``OptimizedModule``) holds the module it compiles."""


def _step_wrapper_code() -> Any:
    """The code of torch's ``optimizer.step()`` wrapper, which iterates the step hooks (None: unknown)."""
    try:
        return torch.optim.Optimizer.profile_hook_step(lambda: None).__code__  # type: ignore[arg-type]
    except Exception:
        return None


_STEP_WRAPPER = _step_wrapper_code()


def _inside_optimizer_step() -> bool:
    """True when called (at any depth) from inside an ``optimizer.step()``, where torch iterates the step hooks;
    True also when that cannot be told."""
    import sys

    if _STEP_WRAPPER is None:
        return True
    frame: Any = sys._getframe(1)
    while frame is not None:
        if frame.f_code is _STEP_WRAPPER:
            return True
        frame = frame.f_back
    return False


def _plain_name(name: str) -> str:
    """A module or parameter name without the ``_orig_mod`` parts torch.compile's wrappers add."""
    if _COMPILED_PREFIX not in name:
        return name
    return ".".join(part for part in name.split(".") if part != _COMPILED_PREFIX)


def _under_compile(model: torch.nn.Module) -> bool:
    """``model`` is, or holds, a torch.compile'd module."""
    return any(name.rsplit(".", 1)[-1] == _COMPILED_PREFIX for name, _ in model.named_modules())


def reduce(tensor: torch.Tensor, saturation: str | None = None, bins: int = 0,
           extra: Sequence[torch.Tensor] = ()) -> torch.Tensor:
    """The reductions of ``tensor`` (:data:`schema.REDUCTIONS`, then ``saturated`` when ``saturation``
    names ``sigmoid``/``tanh``, then the 0-dim ``extra`` values, then ``bins`` histogram counts) as one float32
    tensor on its device."""
    x = _dense_values(tensor).float()
    a = x.abs()
    n = x.numel()
    zero = x.new_zeros(())
    values = [x.mean(), x.std(unbiased=False) if n > 1 else zero, x.min(), x.max(), a.sum(),
              torch.linalg.vector_norm(x), a.mean(), a.std(unbiased=False) if n > 1 else zero, a.min(), a.max(),
              (x == 0).float().mean(), (~torch.isfinite(x)).float().mean()]
    if saturation == "sigmoid":
        values.append(((x < 0.01) | (x > 0.99)).float().mean())
    elif saturation == "tanh":
        values.append((a > 0.99).float().mean())
    values.extend(e.float() for e in extra)
    out = torch.stack(values)
    if bins:
        out = torch.cat([out, torch.histc(torch.nan_to_num(x), bins=bins)])
    return out


def _dense_values(tensor: torch.Tensor) -> torch.Tensor:
    """The stored values of ``tensor`` as one flat real tensor: a sparse tensor's values (its implicit zeros are
    not counted), a complex tensor's magnitudes (``abs``, without the cast warning)."""
    x = tensor.detach()
    if x.layout == torch.sparse_coo:
        x = x.coalesce().values()
    elif x.layout != torch.strided:
        x = x.values()
    x = x.reshape(-1)
    return x.abs() if x.is_complex() else x


def _to_host(tensor: torch.Tensor) -> torch.Tensor:
    """A pinned host copy of ``tensor``, started without waiting."""
    host = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu", pin_memory=True)
    host.copy_(tensor, non_blocking=True)
    return host


def _first_tensor(value: Any) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, list | tuple):
        for item in value:
            if isinstance(item, torch.Tensor):
                return item
    return None


def _saturation(module: Any) -> str | None:
    if isinstance(module, torch.nn.Sigmoid):
        return "sigmoid"
    if isinstance(module, torch.nn.Tanh):
        return "tanh"
    return None


class _Saved:
    """One reduced tensor of the step being saved."""

    __slots__ = ("name", "kind", "collections", "module", "shape", "value", "extra", "full")

    def __init__(self, name: str, kind: str, collections: list[str], module: str | None, shape: Sequence[int],
                 value: torch.Tensor, extra: tuple[str, ...]) -> None:
        self.name, self.kind, self.collections, self.module = name, kind, collections, module
        self.shape, self.value, self.extra = list(shape), value, extra
        self.full: torch.Tensor | None = None
        """The whole tensor (float32, flat), when ``OTELPROF_TENSOR_SAVE`` selects it and the budget allows."""


class TensorCollector:
    """Saves the configured collections of every model it is given (or finds) into ``directory``."""

    def __init__(self, collections: Sequence[Collection], every: int, directory: Path | None, bins: int = 0) -> None:
        self.collections = tuple(collections)
        self.every = every
        self.bins = bins
        self.directory = directory
        self.step = 0
        self.models: list[tuple[str, torch.nn.Module]] = []
        self._known: weakref.WeakSet[Any] = weakref.WeakSet()
        self._primary: Any = None
        self._active: list[Collection] = []
        self._saved: list[_Saved] = []
        self._forward_handles: list[Any] = []
        self._stable = False
        """torch.compile is used: the activation hooks are on every selected layer for good (never added or
        removed per saved step)."""
        self._hooked: set[int] = set()
        """ids of the layers holding a stable activation hook."""
        self._activation_names: list[tuple[str, str]] = []
        """(kind, name) of the activations the stable hooks can reduce."""
        self._done: set[str] = set()
        """Activations reduced at the step being saved (the first forward's only)."""
        self._previous: dict[str, torch.Tensor] = {}
        self._pending: tuple[int, list[_Saved], torch.Tensor, Any] | None = None
        self._labels: torch.Tensor | None = None
        self._file: IO[str] | None = None
        self._lock = threading.Lock()
        self._handles: list[Any] = []
        self._discovering: Any = None
        self._discovered = False
        """The first step of the primary optimizer ended: no more models are discovered."""
        self._stepping = False
        """Inside the first optimizer's ``step()`` (where a closure optimizer, L-BFGS, calls the model)."""
        self.dropped = 0
        """Tensors not saved (over :data:`MAX_TENSORS_PER_STEP`, or not written)."""
        self.closed = False
        self.failed = False
        """A hook raised: every hook is a no-op until :meth:`close` removes them."""
        self._written_header = False
        self.metrics: TensorMetrics | None = None
        """Where the saved statistics go as metrics (None: only to the recording)."""
        self.save: re.Pattern[str] | None = None
        """Tensors whose full values are saved (``OTELPROF_TENSOR_SAVE``), within the two byte budgets."""
        self.save_max_bytes = 0
        self.save_total_bytes = 0
        self.saved_bytes = 0
        """Bytes of full tensors written so far."""
        self.full_dropped = 0
        """Full tensors not saved (over a budget, or not written)."""
        self._step_bytes = 0
        self._full_dropped: list[str] = []

    # ------------------------------------------------------------------ set-up
    def start(self, discover: bool) -> None:
        """Hook every optimizer's step; ``discover``: also take each top-level module called before the first
        optimizer step as a model (``otelprof run``)."""
        from torch.optim import optimizer as optim_module

        pre, post = self._guard(self._pre_step), self._guard(self._post_step)

        def pre_hook(*args: Any) -> None:
            if _stale["post"]:  # torch iterates the pre hooks now: the post hooks may go
                _drop_stale("post")
            pre(*args)

        def post_hook(*args: Any) -> None:
            if _stale["pre"]:
                _drop_stale("pre")
            post(*args)

        self._handles = [optim_module.register_optimizer_step_pre_hook(pre_hook),
                         optim_module.register_optimizer_step_post_hook(post_hook)]
        if discover:
            self.discover()
        torch_compile.on_first_compile(self._before_compile)
        self._arm()
        atexit.register(self.close)

    def _before_compile(self) -> None:
        """The first compilation starts (before Dynamo traces anything): activation hooks for good, on every
        layer any collection selects, so that no saved step changes a module's hooks again."""
        if self.closed or self._stable:
            return
        self._stable = True
        self._hook_forwards(self.models)

    def discover(self) -> None:
        """Take each top-level module with parameters called before the first optimizer step ends as a model
        (a closure optimizer, L-BFGS, calls it inside ``step()`` only)."""
        from torch.nn.modules import module as nn_module

        if self._discovering is None and self._primary is None and not self.closed:
            torch_compile.quiet_global_hooks()
            self._discovering = nn_module.register_module_forward_pre_hook(
                torch_compile.skipped_while_compiling(self._guard(self._discover)))

    def add_model(self, model: torch.nn.Module) -> None:
        if model in self._known or not isinstance(model, torch.nn.Module):
            return
        plain = getattr(model, _COMPILED_PREFIX, model)  # torch.compile(model): named as the model
        prefix = "" if not self.models else f"{type(plain).__name__.lower()}{len(self.models)}."
        self.models.append((prefix, model))
        for module in model.modules():
            self._known.add(module)
        if not self._stable and (_under_compile(model) or torch_compile.has_compiled()):
            self._stable = True  # hooked for good before its first compilation
            self._hook_forwards(self.models)
        elif self._active or self._stable:
            self._hook_forwards([(prefix, model)])
            if self._stepping:  # found by a closure inside step(): its weights are still those before the step
                self._save_parameters([(prefix + _plain_name(name), p) for name, p in model.named_parameters()])

    def _discover(self, module: Any, args: Any) -> None:
        # a module hook adding module hooks: safe, torch calls a copy of a module's hooks
        if not self._discovered and module not in self._known and next(module.parameters(recurse=True), None) \
                is not None:
            self.add_model(module)

    def _guard(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def hook(*args: Any) -> None:
            if self.closed or self.failed:
                return
            try:
                fn(*args)
            except Exception as exc:
                warn_once("tensors:hook", "otelprof: saving tensor collections failed (%s: %s); they are off, "
                          "training goes on", type(exc).__name__, exc)
                self.failed = True  # the hooks are no-ops now; removed at close (never inside torch's hook loop)
        return hook

    # ------------------------------------------------------------------ per step
    def _arm(self) -> None:
        """Decide whether ``self.step`` saves; if so hook the forwards that it needs."""
        self._active = [c for c in self.collections if c.saves(self.step, self.every)]
        self._done.clear()
        if self._active and not self._stable:
            self._hook_forwards(self.models)

    def _selected(self, kind: str, name: str) -> list[str]:
        return [c.name for c in self._active if c.selects(kind, name)]

    def _hook_forwards(self, models: Sequence[tuple[str, torch.nn.Module]]) -> None:
        """Activation hooks on the layers of ``models`` the saving collections select (stable: any collection,
        each layer once)."""
        for prefix, model in models:
            for module_name, module in model.named_modules():
                if next(module.children(), None) is not None:
                    continue  # layers only
                name = prefix + (_plain_name(module_name)
                                 or type(getattr(model, _COMPILED_PREFIX, model)).__name__.lower())
                if self._stable:
                    if id(module) in self._hooked or not any(
                            c.selects("outputs", f"{name}/output") or c.selects("inputs", f"{name}/input")
                            for c in self.collections):
                        continue
                    self._hooked.add(id(module))
                    self._activation_names += [("outputs", f"{name}/output"), ("inputs", f"{name}/input")]
                elif not (self._selected("outputs", f"{name}/output") or self._selected("inputs", f"{name}/input")):
                    continue
                hook = torch_compile.skipped_while_compiling(self._guard(self._forward_hook(name, module)))
                self._forward_handles.append(module.register_forward_hook(hook))

    def _forward_hook(self, name: str, module: Any) -> Callable[[Any, Any, Any], None]:
        kind_name = type(module).__name__
        saturation = _saturation(module)
        wanted_names = (("outputs", f"{name}/output"), ("inputs", f"{name}/input"))

        def hook(mod: Any, args: Any, output: Any) -> None:
            if not self._active or not mod.training or not torch.is_grad_enabled():
                return  # not a saved step; evaluation forwards between train steps (eval mode, no gradients)
            for kind, full_name in wanted_names:
                if full_name in self._done:
                    continue  # the first forward of the step (gradient accumulation: one micro-batch)
                wanted = self._selected(kind, full_name)
                tensor = _first_tensor(output if kind == "outputs" else args)
                if not wanted or tensor is None or tensor.numel() == 0:
                    continue
                self._done.add(full_name)
                if tensor.layout not in REDUCED_LAYOUTS:
                    self.dropped += 1
                    continue
                extra = ("saturated",) if kind == "outputs" and saturation else ()
                self._add(_Saved(full_name, kind, wanted, kind_name, tensor.shape,
                                 reduce(tensor, saturation if kind == "outputs" else None, self.bins), extra), tensor)
        return hook

    def _add(self, saved: _Saved, tensor: torch.Tensor | None = None) -> None:
        if len(self._saved) >= MAX_TENSORS_PER_STEP:
            self.dropped += 1
            return
        if tensor is not None and self.save is not None and self.save.search(saved.name):
            size = 4 * tensor.numel()
            if (self._step_bytes + size > self.save_max_bytes
                    or self.saved_bytes + self._step_bytes + size > self.save_total_bytes):
                self._full_dropped.append(saved.name)
                self.full_dropped += 1
                warn_once("tensors:save", "otelprof: full tensors over OTELPROF_TENSOR_SAVE_MAX_BYTES (per saved "
                          "step) or OTELPROF_TENSOR_SAVE_TOTAL_BYTES are dropped and counted (%s)", saved.name)
            else:
                self._step_bytes += size
                saved.full = _dense_values(tensor).float().clone()
        self._saved.append(saved)

    def _parameters(self) -> list[tuple[str, torch.nn.Parameter]]:
        return [(prefix + _plain_name(name), p) for prefix, model in self.models
                for name, p in model.named_parameters()]

    def _pre_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._primary is None:
            self._primary = optimizer
        if optimizer is not self._primary:
            return
        self._stepping = True
        if self._active:
            self._save_parameters(self._parameters())

    def _save_parameters(self, parameters: list[tuple[str, torch.nn.Parameter]]) -> None:
        """The selected weights and gradients as they are before the step (and the weights to follow)."""
        with torch.no_grad():
            for name, p in parameters:
                kind = "biases" if name.rsplit(".", 1)[-1].startswith("bias") else "weights"
                if p.layout not in REDUCED_LAYOUTS:  # the weight, its gradient and its update: none is reduced
                    self.dropped += (bool(self._selected(kind, name))
                                     + bool(p.grad is not None and self._selected("gradients", f"gradients/{name}"))
                                     + bool(self._selected("optimizer", f"update/{name}")))
                    continue
                wanted = self._selected(kind, name)
                if wanted:
                    self._add(_Saved(name, kind, wanted, None, p.shape, reduce(p, None, self.bins), ()), p)
                grad = p.grad
                if grad is not None:
                    wanted = self._selected("gradients", f"gradients/{name}")
                    if wanted and grad.layout not in REDUCED_LAYOUTS:
                        self.dropped += 1
                    elif wanted:
                        self._add(_Saved(f"gradients/{name}", "gradients", wanted, None, grad.shape,
                                         reduce(grad, None, self.bins), ()), grad)
                if self._selected("optimizer", f"update/{name}"):
                    self._previous[name] = p.detach().clone()

    def _post_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if optimizer is not self._primary:
            return
        self._stepping = False
        self._discovered = True
        if self._discovering is not None and not self._stable:  # the first step is over: the models are the ones
            self._discovering.remove()  # called until now (under torch.compile it stays, a no-op: see _discover)
            self._discovering = None
            torch_compile.unquiet_global_hooks()
        if self._active:
            with torch.no_grad():
                for name, p in self._parameters():
                    before = self._previous.pop(name, None)
                    if before is None:
                        continue
                    update = p.detach() - before
                    norm = torch.linalg.vector_norm(before.float()).clamp_min(1e-12)
                    ratio = torch.linalg.vector_norm(update.float()) / norm
                    value = reduce(update, None, self.bins, (ratio,))
                    self._add(_Saved(f"update/{name}", "optimizer", self._selected("optimizer", f"update/{name}"),
                                     None, p.shape, value, ("ratio",)), update)
            self._previous.clear()
            if self._stable:  # activations of compiled layers (their hooks ran as nothing) or not called
                self.dropped += sum(1 for kind, full_name in self._activation_names
                                    if full_name not in self._done and self._selected(kind, full_name))
            else:
                for handle in self._forward_handles:
                    handle.remove()
                self._forward_handles.clear()
            self._finish_step()
        elif self._pending is not None and self._copied():
            self._resolve()  # the saved step's values, one step later: live metrics do not wait for the next save
        self.step += 1
        self._arm()

    def _finish_step(self) -> None:
        """Stack the step's reductions and start copying them off the device; write the previous step's."""
        saved, self._saved = self._saved, []
        labels, self._labels = self._labels, None
        dropped, self._full_dropped, self._step_bytes = self._full_dropped, [], 0
        self._resolve()
        values = [s.value for s in saved]
        if labels is not None:
            values.append(labels.float())
        if not values:
            return
        flat = torch.cat(values)
        fulls = [s.full for s in saved if s.full is not None]
        full = torch.cat(fulls) if fulls else None
        event = None
        if flat.is_cuda:
            flat = _to_host(flat)
            full = _to_host(full) if full is not None and full.is_cuda else full
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            event.record()
        elif full is not None and full.is_cuda:
            full = _to_host(full)
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            event.record()
        self._pending = (self.step, saved, flat, (event, labels.numel() if labels is not None else 0, full, dropped))

    def _copied(self) -> bool:
        """Whether the pending step's values are on the host (never waits)."""
        assert self._pending is not None
        event = self._pending[3][0]
        return event is None or bool(event.query())

    def _resolve(self) -> None:
        """Write the pending step's values (waits for its copy only at exit: the next saved step is later)."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        step, saved, flat, (event, label_count, full, dropped) = pending
        if event is not None:
            event.synchronize()
        values = flat.tolist()
        lines = self._full_lines(step, saved, full, dropped)
        at = 0
        for s in saved:
            width = s.value.numel()
            row = values[at:at + width]
            at += width
            reductions = dict(zip(schema.REDUCTIONS + s.extra, row))
            record: dict[str, Any] = {"k": schema.KIND_TENSOR, "n": step, "name": s.name, "kind": s.kind,
                                      "c": s.collections, "shape": s.shape, "r": reductions}
            if s.module is not None:
                record["m"] = s.module
            if self.bins:
                record["h"] = row[len(schema.REDUCTIONS) + len(s.extra):]
            lines.append(_encode(record))
        counts: list[int] = []
        if label_count:
            counts = [int(v) for v in values[at:at + label_count]]
            lines.append(_encode({"k": schema.KIND_LABELS, "n": step, "counts": counts}))
        self._write(lines)
        if self.metrics is not None:
            self._observe(saved, values, counts)

    def _observe(self, saved: list[_Saved], values: list[float], counts: list[int]) -> None:
        """Add the step to the metrics; a failure turns only the metrics off (warned once)."""
        assert self.metrics is not None
        try:
            rows = []
            at = 0
            for s in saved:
                width = s.value.numel()
                reductions = dict(zip(schema.REDUCTIONS + s.extra, values[at:at + width]))
                at += width
                rows.append((Saved(s.name, s.kind, s.module, tuple(s.shape), reductions), s.collections[0]))
            self.metrics.observe(rows, counts)
        except Exception as exc:
            self.metrics = None
            warn_once("tensors:metrics", "otelprof: tensor metrics failed (%s: %s); they are off, the recording "
                      "goes on", type(exc).__name__, exc)

    def _full_lines(self, step: int, saved: list[_Saved], full: torch.Tensor | None, dropped: list[str]) -> list[str]:
        """Append the step's full tensors to ``tensors-full.bin``; their index records (and the dropped)."""
        lines = []
        failed: list[str] = []
        if full is not None and self.directory is not None:
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
                with open(self.directory / schema.TENSORS_FULL, "ab") as handle:
                    at = handle.tell()
                    handle.write(full.numpy().astype("<f4", copy=False).tobytes())
                for s in saved:
                    if s.full is not None:
                        count = s.full.numel()
                        lines.append(_encode({"k": schema.KIND_FULL, "n": step, "name": s.name, "shape": s.shape,
                                              "at": at, "count": count}))
                        at += 4 * count
                self.saved_bytes += 4 * full.numel()
            except (OSError, ValueError, RuntimeError) as exc:
                lines = []
                failed = [s.name for s in saved if s.full is not None]
                warn_once("tensors:save-write", "otelprof: cannot write %s (%s); full tensors are dropped and "
                          "counted, training goes on", schema.TENSORS_FULL, exc)
        elif full is not None:
            failed = [s.name for s in saved if s.full is not None]
        self.full_dropped += len(failed)
        if dropped or failed:
            lines.append(_encode({"k": schema.KIND_FULL_DROPPED, "n": step, "names": [*dropped, *failed]}))
        for s in saved:
            s.full = None
        return lines

    def record_labels(self, labels: Any) -> None:
        """Count class labels of a batch (integer tensor) for the saved step (class-imbalance check)."""
        if self.closed or not self._active or not isinstance(labels, torch.Tensor) or labels.dtype.is_floating_point:
            return
        try:
            flat = labels.detach().reshape(-1).long()
            if flat.numel() == 0:
                return
            counts = torch.bincount(flat.clamp(0, MAX_CLASSES - 1))
            if self._labels is None:
                self._labels = counts
            else:
                size = max(self._labels.numel(), counts.numel())
                self._labels = (torch.nn.functional.pad(self._labels, (0, size - self._labels.numel()))
                                + torch.nn.functional.pad(counts, (0, size - counts.numel())))
        except Exception as exc:
            warn_once("tensors:labels", "otelprof: cannot count the labels (%s: %s); ignored", type(exc).__name__, exc)

    # ------------------------------------------------------------------ output
    def _write(self, lines: list[str]) -> None:
        if not lines:
            return
        with self._lock:
            if self.directory is None:
                if self.metrics is None:  # nowhere to go (without a recording the metrics are the output)
                    self.dropped += len(lines)
                return
            try:
                if self._file is None:
                    self.directory.mkdir(parents=True, exist_ok=True)
                    self._file = open(self.directory / schema.TENSORS, "a", encoding="utf-8")  # noqa: SIM115
                if not self._written_header:
                    self._file.write(_encode(self.header()) + "\n")
                    self._written_header = True
                self._file.write("\n".join(lines) + "\n")
                self._file.flush()
            except (OSError, ValueError) as exc:
                self.dropped += len(lines)
                warn_once("tensors:write", "otelprof: cannot write %s (%s); tensor statistics are dropped and "
                          "counted, training goes on", schema.TENSORS, exc)

    def header(self) -> dict[str, Any]:
        return {"k": schema.KIND_HEADER, "every": self.every, "bins": self.bins,
                "reductions": list(schema.REDUCTIONS),
                "collections": [{"name": c.name, "include": c.include, "exclude": c.exclude, "every": c.every,
                                 "start": c.start, "end": c.end} for c in self.collections]}

    def close(self) -> None:
        """Write what is pending and remove every hook (idempotent)."""
        if self.closed:
            return
        self.closed = True  # every hook is a no-op from here
        for handle in self._forward_handles:  # module hooks: torch calls a copy of them, removing is safe
            handle.remove()
        if self._discovering is not None:
            self._discovering.remove()
            torch_compile.unquiet_global_hooks()
        if self._handles:
            _remove_later(*self._handles)
        self._handles, self._forward_handles, self._discovering = [], [], None
        try:
            self._resolve()
        except Exception as exc:
            warn_once("tensors:close", "otelprof: cannot write the last tensor statistics (%s)", exc)
        with self._lock:
            if self._file is not None:
                with contextlib.suppress(OSError):
                    self._file.close()
                self._file = None


_stale: dict[str, list[Any]] = {"pre": [], "post": []}
"""Optimizer step-hook handles of closed collectors, removed where torch does not iterate them: a pre hook's by
the next post hook of a collector (or outside any ``optimizer.step()``), a post hook's by the next pre hook."""


def _remove_later(pre: Any, post: Any) -> None:
    """Remove a closed collector's optimizer hooks now when no ``optimizer.step()`` is under way, else where it is
    safe (the hooks are no-ops meanwhile): never inside torch's iteration of them."""
    _stale["pre"].append(pre)
    _stale["post"].append(post)
    if not _inside_optimizer_step():
        _drop_stale("pre")
        _drop_stale("post")


def _drop_stale(kind: str) -> None:
    handles, _stale[kind] = _stale[kind], []
    for handle in handles:
        with contextlib.suppress(Exception):
            handle.remove()


_collector: list[TensorCollector] = []
"""The process's collector (at most one)."""


def collect(spec: Any = None, model: Any = None, discover: bool = False) -> TensorCollector | None:
    """Start saving collections (``spec`` as :func:`otelprof.tensor_collections.as_collections` takes it; None: the
    config's ``OTELPROF_COLLECTIONS``) and add ``model``. Called by ``instrument(collections=...)`` and, under
    ``otelprof run``, with ``discover=True``. The first call's collections hold for the process."""
    from otelprof.runtime.session import get_session
    from otelprof.tensor_collections import as_collections

    session = get_session()
    if session is None:
        return None
    if not _collector:
        if not _inside_optimizer_step():  # hooks of an earlier collector that went from inside a step
            _drop_stale("pre")
            _drop_stale("post")
        config = session.config
        try:
            collections = as_collections(config.collections if spec is None else spec)
        except (ValueError, TypeError) as exc:
            warn_once("tensors:spec", "otelprof: bad collections (%s); none are saved", exc)
            return None
        if not collections:
            return None
        if session.run_dir is None and config.tensor_series_max == 0:
            warn_once("tensors:record", "otelprof: tensor collections go to the recording, which is off "
                      "(OTELPROF_RECORD=false), and to the metrics, which are off (OTELPROF_TENSOR_SERIES_MAX=0); "
                      "none are saved")
            return None
        collector = TensorCollector(collections, config.save_interval, session.run_dir, config.tensor_histogram_bins)
        if config.tensor_save:
            collector.save = re.compile(config.tensor_save)
            collector.save_max_bytes, collector.save_total_bytes = (config.tensor_save_max_bytes,
                                                                    config.tensor_save_total_bytes)
        if config.tensor_series_max > 0:
            collector.metrics = TensorMetrics(session.registry, config.tensor_series_max)
        collector.start(discover)
        _collector.append(collector)
    collector = _collector[0]
    if discover:
        collector.discover()
    if model is not None:
        collector.add_model(model)
    return collector


def record_labels(labels: Any) -> None:
    """Count a batch's integer class labels for the class-imbalance check (only at saved steps; else nothing)."""
    if _collector:
        _collector[0].record_labels(labels)


def stop() -> None:
    """Write what is pending and remove the collector's hooks."""
    while _collector:
        _collector.pop().close()
    if not _inside_optimizer_step():  # what a collector closed inside a step left
        _drop_stale("pre")
        _drop_stale("post")
