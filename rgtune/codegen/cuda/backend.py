"""The ``"cuda"`` :class:`~rgtune.codegen.base.Backend`: generate, compile with NVRTC, load, run.

``build`` checks the schedule (an invalid point raises :class:`InvalidSchedule` and compiles
nothing), generates one CUDA source per IR kernel, compiles them for the device's own
architecture (cubin cache on disk), loads them and binds the graph; a training program's
:class:`~rgtune.codegen.base.BuiltProgram` also runs its two phases (``run_forward``, ``run_backward``)
and a whole step (``run_training``).
``compile_only`` does the first two steps for any architectures and needs no GPU.

Example (no GPU needed):
    >>> from rgtune.ir.models import build_model
    >>> from rgtune.ir.pipeline import compile_program
    >>> kp = compile_program(build_model("rgcn", 8, 8)).kernels
    >>> ok, why = CudaBackend.available()
    >>> isinstance(why, str)
    True
    >>> CudaBackend().compile_only(kp, {}, archs=("sm_80",)).cubins["gemm1"]["sm_80"].data[:4]
    b'\\x7fELF'
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from rgtune._environ import env_flag
from rgtune.codegen.base import Backend, BackendError, BuiltProgram, CompiledProgram
from rgtune.codegen.cuda import nvrtc
from rgtune.codegen.cuda.generate import GeneratedProgram, InvalidSchedule, generate
from rgtune.data.batch import Batch
from rgtune.data.graph import HeteroGraph
from rgtune.ir.kernels import KernelProgram

__all__ = ["CudaBackend", "InvalidSchedule"]


def _graphs_from_env() -> bool:
    try:
        return env_flag("RGTUNE_CUDA_GRAPHS", default=True)
    except ValueError as e:
        raise BackendError(str(e)) from None


class CudaBackend(Backend):
    """CUDA C through NVRTC, launched on torch tensors (a recorded CUDA graph per program), timed with CUDA events."""

    name = "cuda"
    target = "cuda"
    #: training programs build too: their scatter and weight-gradient kernels are generated (:mod:`._scatter`,
    #: :mod:`._weightgrad`), and run in two phases
    training = "phases"
    device_type = "cuda"
    generates_sources = True
    times_on_device = True

    def __init__(self, epilogue: str = "auto", cache: bool = True, graphs: bool | None = None) -> None:
        """``graphs``: replay each program as a recorded CUDA graph (see :class:`~.runtime.CudaProgram`);
        ``False`` launches kernel by kernel; ``None`` (default) reads ``$RGTUNE_CUDA_GRAPHS``
        (``0`` turns replay off, for every command). The choice is part of :meth:`device_info`,
        so the trial database keeps timings of the two apart."""
        self.epilogue = epilogue
        self.cache = cache
        self.graphs = _graphs_from_env() if graphs is None else graphs

    @classmethod
    def compile_available(cls) -> tuple[bool, str]:
        """Whether kernels can be compiled here (CuPy + NVRTC; no GPU needed)."""
        try:
            nvrtc.nvrtc_version()
        except BackendError as e:
            return False, str(e)
        return True, ""

    @classmethod
    def available(cls) -> tuple[bool, str]:
        ok, why = cls.compile_available()
        if not ok:
            return False, why
        from rgtune.codegen.cuda.runtime import gpu_count

        n, why = gpu_count()
        return (True, "") if n else (False, why)

    # ---------------------------------------------------------------- compile
    def generate(self, kp: KernelProgram, schedule: Mapping[str, Any]) -> GeneratedProgram:
        return generate(kp, schedule, self.epilogue)

    def compile_only(self, kp: KernelProgram, schedule: Mapping[str, Any], archs: Sequence[str] | None = None,
                     workers: int | None = None) -> nvrtc.CompiledProgram:
        """Generate and compile for ``archs`` (default sm_80 and sm_90) without touching a GPU."""
        gen = self.generate(kp, schedule)
        return nvrtc.compile_program(gen.units, archs, workers, self.cache)

    # ---------------------------------------------------------------- run
    def compile(self, kp: KernelProgram, schedule: Mapping[str, Any]) -> CompiledProgram:
        ok, why = self.available()
        if not ok:
            raise BackendError(f"the CUDA backend cannot run here: {why}")
        from rgtune.codegen.cuda.runtime import device_arch

        gen = self.generate(kp, schedule)
        arch = device_arch()
        compiled = nvrtc.compile_program(gen.units, (arch,), cache=self.cache)
        # JSON-friendly: the tuner stores it with the trial
        info = {"arch": arch, "nvrtc": ".".join(map(str, nvrtc.nvrtc_version())),
                "resources": {u: {f: vars(r) for f, r in c[arch].resources.items()}
                              for u, c in compiled.cubins.items()}}
        return _CudaCompiled(self.name, kp, gen, {u: c[arch] for u, c in compiled.cubins.items()}, compiled.seconds,
                             all(c[arch].cached for c in compiled.cubins.values()), info, self.graphs)

    def time_runs(self, built: BuiltProgram, x: Any, params: Mapping[str, Any], warmup: int,
                  repeats: int) -> list[float]:
        """Seconds per run, by CUDA events on torch's current stream, after ``warmup`` runs."""
        from rgtune.codegen.cuda.runtime import time_cuda

        t = time_cuda(lambda: built.run(x, params), warmup=warmup, repeat=repeats)
        self.synchronize()
        return [ms / 1000.0 for ms in t["times_ms"]]

    def device_info(self) -> dict[str, Any]:
        info: dict[str, Any] = {"backend": self.name, "launch": "cuda graph" if self.graphs else "kernel by kernel"}
        try:
            info["nvrtc"] = ".".join(map(str, nvrtc.nvrtc_version()))
            info["compiler"] = f"NVRTC {info['nvrtc']} ({' '.join(nvrtc.options('sm_XX')[1:])})"
        except BackendError as e:
            info["nvrtc"] = f"unavailable: {e}"
        ok, why = self.available()
        if ok:
            from rgtune.codegen.cuda.runtime import device_facts

            info.update(device_facts())
        else:
            info["device"] = f"none ({why})"
        return info

    def synchronize(self) -> None:
        """Wait for the GPU; a kernel fault surfaces here as ``LaunchError`` (sticky: restart the process)."""
        import torch

        if torch.cuda.is_available():
            from rgtune.codegen.cuda.runtime import STICKY_NOTE, LaunchError

            try:
                torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001 - RuntimeError or torch.AcceleratorError
                raise LaunchError(f"{e}; {STICKY_NOTE}") from e


class _CudaCompiled(CompiledProgram):
    """One program's cubins for this device; :meth:`bind` loads them for a graph (a :class:`~.runtime.CudaProgram`)."""

    def __init__(self, backend: str, kp: KernelProgram, gen: GeneratedProgram, cubins: dict[str, Any], seconds: float,
                 cache_hit: bool, info: dict[str, Any], graphs: bool) -> None:
        self.backend, self.kp, self.gen, self.cubins, self.info, self.graphs = backend, kp, gen, cubins, info, graphs
        self.sources, self.compile_seconds, self.cache_hit = gen.sources, seconds, cache_hit

    def bind(self, graph: "HeteroGraph | Batch") -> BuiltProgram:
        from rgtune.codegen.cuda.runtime import CudaProgram

        program = CudaProgram(self.kp, self.gen.units, self.cubins, graph, graphs=self.graphs)
        return built_program(self.backend, self.kp, program, self.sources, self.compile_seconds, self.cache_hit,
                             self.info)


def built_program(backend: str, kp: KernelProgram, program: Any, sources: dict[str, str], seconds: float,
                  cache_hit: bool, info: dict[str, Any] | None = None) -> BuiltProgram:
    """The :class:`BuiltProgram` of a loaded ``program`` (a :class:`~.runtime.ProgramRunner`: on the GPU or
    the emulator); a training program's runs its phases apart (``forward_fn``/``backward_fn``), as a layer
    in a model trains."""
    training = kp.is_training
    return BuiltProgram(backend, sources, seconds, cache_hit, program.run, info or {},
                        train_fn=program.run_training if training else None,
                        forward_fn=program.run_forward if training else None,
                        backward_fn=program.run_backward if training else None)
