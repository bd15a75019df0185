"""Tensor-parallel worker processes: rank 0 (the user's process) drives ranks 1..N-1.

Every rank holds a shard of the model and runs the same forward pass; the layers' all-reduce and
all-gather (NCCL on CUDA, gloo on CPU) stitch the shards together. Rank 0 alone schedules and samples.
Each worker blocks on its own command queue: a queue hands over whole messages in order, so a worker never
reads a half-written command and rank 0 never overwrites one that was not read. A worker that fails
reports its traceback on the error queue and exits; its closed connections make rank 0's next
collective fail, and rank 0 raises the worker's error. Workers are daemon processes, and `shutdown()`
(also run by `del llm` and at interpreter exit) ends them and the process group.
"""
import atexit
import multiprocessing as mp
import queue
import socket
import time
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist

from nanovllm.engine.sequence import Sequence

TIMEOUT = timedelta(minutes=10)   # a collective that waits this long on a silent peer fails
START_TIMEOUT_S = 300              # spawned workers must be running by then (imports take ~10 s)


def free_port() -> int:
    """A TCP port nobody listens on now, for the rendezvous (two engines must not collide)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_distributed(config, rank: int, port: int) -> None:
    backend = "nccl" if config.device == "cuda" else "gloo"
    if config.device == "cuda":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", world_size=config.tensor_parallel_size,
                            rank=rank, timeout=TIMEOUT)


def worker_main(runner_class, config, rank: int, port: int, commands, errors, ready) -> None:
    """A rank's loop: build `runner_class(config)` (the ModelRunner, passed in so that this module does not
    import the runner that imports it) and run the commands rank 0 sends."""
    Sequence.block_size = config.kvcache_block_size
    try:
        ready.put(rank)     # started: rank 0 may now wait for the rendezvous
        init_distributed(config, rank, port)
        runner, pending = runner_class(config), None
        while True:
            method, args = commands.get()
            if method == "exit":
                break
            if method == "launch":
                previous, pending = pending, runner.launch(*args, pending)
                if previous is not None:
                    previous.done.synchronize()   # as rank 0 does: its host buffers may be reused next
            else:
                getattr(runner, method)(*args)
    except BaseException:
        errors.put(f"tensor-parallel worker {rank} failed:\n{traceback.format_exc()}")
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


class WorkerGroup:
    """Ranks 1..N-1 as spawned processes, and rank 0's end of their command queues."""

    def __init__(self, config, runner_class):
        ctx = mp.get_context("spawn")
        port = free_port()
        self.errors, ready = ctx.Queue(), ctx.Queue()
        self.queues, self.processes = [], []
        for rank in range(1, config.tensor_parallel_size):
            commands = ctx.Queue()
            process = ctx.Process(target=worker_main,
                                  args=(runner_class, config, rank, port, commands, self.errors, ready),
                                  daemon=True)
            process.start()
            self.queues.append(commands)
            self.processes.append(process)
        atexit.register(self.shutdown)
        self._wait_until_started(ready)
        try:
            init_distributed(config, 0, port)
        except BaseException:
            self.raise_worker_error()
            raise

    def _wait_until_started(self, ready) -> None:
        """Every worker process has started running; one that died first is reported at once (its exit
        code and error), instead of rank 0 waiting out the rendezvous timeout."""
        started, deadline = set(), time.monotonic() + START_TIMEOUT_S
        while len(started) < len(self.processes):
            try:
                started.add(ready.get(timeout=0.2))
                continue
            except queue.Empty:
                pass
            dead = [(rank, p.exitcode) for rank, p in enumerate(self.processes, start=1)
                    if rank not in started and not p.is_alive()]
            if dead or time.monotonic() > deadline:
                self.raise_worker_error(wait_s=1)
                self.shutdown()
                what = (f"worker {dead[0][0]} exited with code {dead[0][1]} before starting" if dead else
                        f"workers did not start within {START_TIMEOUT_S} s")
                raise RuntimeError(f"tensor-parallel {what}. Its error is on stderr; a script that creates an "
                                   f"LLM with tensor_parallel_size > 1 must do so under "
                                   f"`if __name__ == '__main__':` (workers are spawned and import the script)")

    def call(self, method: str, *args) -> None:
        """Send a command to every worker (they run it in order, in step with rank 0)."""
        self.raise_worker_error()
        for commands in self.queues:
            commands.put((method, args))

    def raise_worker_error(self, wait_s: float = 0.0) -> None:
        """Raise the first error a worker reported (waiting up to wait_s for one), after shutting down."""
        try:
            message = self.errors.get(timeout=wait_s) if wait_s else self.errors.get_nowait()
        except queue.Empty:
            return
        self.shutdown()
        raise RuntimeError(message)

    def shutdown(self) -> None:
        if not self.processes:
            return
        for commands, process in zip(self.queues, self.processes):
            if process.is_alive():
                commands.put(("exit", ()))
        for process in self.processes:
            process.join(timeout=30)
            if process.is_alive():
                process.terminate()
                process.join(timeout=5)
        self.processes = []
        if dist.is_initialized():
            dist.destroy_process_group()
        atexit.unregister(self.shutdown)
