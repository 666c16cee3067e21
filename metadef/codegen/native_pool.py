"""The native worker pool (see :mod:`.native` and :mod:`metadef.backends.x86.threads`).

Example:
    >>> sorted(POOL)[:3]
    ['busy', 'count', 'done']
"""

from __future__ import annotations

from llvmlite import ir

from metadef.codegen.native_ir import I32, I64, PTR, _Callee, _loop

POOL_WORDS = 64
"""The pool's shared state, in int64 words (fields a cache line apart, see :data:`POOL`)."""

POOL = {"next": 0, "done": 8, "tasks": 16, "count": 17, "sleeping": 24, "stop": 32, "busy": 40,
        "syscall": 48, "spin": 49}
"""Word offsets of the pool's fields. ``next`` holds the generation (high 32 bits) and the
next task (low 32 bits) of the group being run: a worker takes a task only by a
compare-and-swap within the generation it saw, so it never runs a task of another group."""

FUTEX_WAIT_PRIVATE, FUTEX_WAKE_PRIVATE, SYS_FUTEX = 128, 129, 202
SPIN = 2000
"""``pause`` loops a worker spins before it sleeps on the futex, unless the pool's ``spin``
word says otherwise: ~55 us on this project's Zen 5 cores (a ``pause`` takes ~28 ns there).
With 100 (~3 us) a worker often slept between two groups of a program and the next group
waited for its futex wake-up. In one process, alternating the spin word run by run (medians
of 25, two threads, two pairs each), 100 -> 2000: ResNet-50 at batch 1 27.8 / 27.5 -> 26.7 /
27.2 ms, MobileNetV2 3.62 / 3.75 -> 3.33 / 3.35 ms, the MLP at batch 8 0.06 / 0.07 -> 0.05 /
0.04 ms, BERT level (82.9 / 84.3 -> 83.6 / 81.1 ms). (OpenBLAS runs single-threaded inside the pool, so no
BLAS threads wait for the core a worker spins on.)"""


def _atomic_add(b: ir.IRBuilder, ptr: ir.Value, value: int) -> ir.Value:
    return b.atomic_rmw("add", ptr, I64(value), "seq_cst")


def _load_atomic(b: ir.IRBuilder, ptr: ir.Value, typ: ir.Type = I64) -> ir.Value:
    return b.load_atomic(ptr, "seq_cst", 8, typ=typ)


def _store_atomic(b: ir.IRBuilder, value: ir.Value, ptr: ir.Value) -> None:
    # llvmlite's builder.store_atomic reads the pointee type, which an opaque pointer lacks
    b._insert(ir.instructions.StoreAtomicInstr(b.block, value, ptr, "seq_cst", 8))


def _pool_module(module: ir.Module) -> None:
    """``md_run_tasks(pool, groups, n)`` and ``md_worker(pool)``: a pool of worker threads
    (Python threads parked in ``md_worker``, the GIL released) that run groups of
    independent calls with the caller. ``groups`` is ``n`` pairs (a table of calls as in
    ``md_run_program``, its length): a group of one runs on the caller; a larger group is
    published to the workers, shared by compare-and-swap, and waited for. A pool already
    running another program (``busy``) leaves the caller to run everything alone."""
    pause = module.declare_intrinsic("llvm.x86.sse2.pause", fnty=ir.FunctionType(ir.VoidType(), []))
    futex = ir.FunctionType(I64, [I64], var_arg=True)
    entry_type = ir.ArrayType(PTR, 3)

    def field(b: ir.IRBuilder, pool: ir.Value, name: str) -> ir.Value:
        return b.gep(pool, [I64(POOL[name])], source_etype=I64)

    def run_task(b: ir.IRBuilder, tasks: ir.Value, i: ir.Value) -> None:
        parts = [b.load(b.gep(tasks, [i, I32(k)], source_etype=entry_type), typ=PTR) for k in range(3)]
        b.call(_Callee(parts[0]), [parts[1], parts[2]])

    def take_all(b: ir.IRBuilder, pool: ir.Value, gen: ir.Value) -> None:
        """Take tasks of generation ``gen`` by CAS until none is left; count each one done."""
        nxt, done = field(b, pool, "next"), field(b, pool, "done")
        tasks = b.inttoptr(_load_atomic(b, field(b, pool, "tasks")), PTR)
        count = _load_atomic(b, field(b, pool, "count"))
        head = b.append_basic_block("take")
        work = b.append_basic_block("work")
        after = b.append_basic_block("taken")
        b.branch(head)
        b.position_at_end(head)
        cur = _load_atomic(b, nxt)
        same = b.icmp_unsigned("==", b.lshr(cur, I64(32)), gen)
        index = b.and_(cur, I64(0xFFFFFFFF))
        left = b.and_(same, b.icmp_signed("<", index, count))
        got = b.append_basic_block("cas")
        b.cbranch(left, got, after)
        b.position_at_end(got)
        pair = b.cmpxchg(nxt, cur, b.add(cur, I64(1)), "seq_cst", "seq_cst")
        b.cbranch(b.extract_value(pair, 1), work, head)
        b.position_at_end(work)
        run_task(b, tasks, index)
        _atomic_add(b, done, 1)
        b.branch(head)
        b.position_at_end(after)

    # md_worker(pool)
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR]), "md_worker")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    pool = fn.args[0]
    nxt = field(b, pool, "next")
    gen_word = b.gep(nxt, [I32(1)], source_etype=I32)  # the high half (little-endian)
    wait = b.append_basic_block("wait")
    b.branch(wait)
    b.position_at_end(wait)
    seen = b.phi(I64)
    seen.add_incoming(I64(0), fn.entry_basic_block)
    spin = b.append_basic_block("spin")
    b.branch(spin)
    b.position_at_end(spin)
    spins = b.phi(I64)
    spins.add_incoming(I64(0), wait)
    gen = b.lshr(_load_atomic(b, nxt), I64(32))
    stop = b.icmp_signed("!=", _load_atomic(b, field(b, pool, "stop")), I64(0))
    quit_ = b.append_basic_block("quit")
    check = b.append_basic_block("check")
    b.cbranch(stop, quit_, check)
    b.position_at_end(check)
    fresh = b.icmp_unsigned("!=", gen, seen)
    new_work = b.append_basic_block("new_work")
    idle = b.append_basic_block("idle")
    b.cbranch(fresh, new_work, idle)
    b.position_at_end(idle)
    keep_spinning = b.icmp_signed("<", spins, _load_atomic(b, field(b, pool, "spin")))
    paused = b.append_basic_block("pause")
    sleep = b.append_basic_block("sleep")
    b.cbranch(keep_spinning, paused, sleep)
    b.position_at_end(paused)
    b.call(pause, [])
    spins.add_incoming(b.add(spins, I64(1)), paused)
    b.branch(spin)
    b.position_at_end(sleep)
    sleeping = field(b, pool, "sleeping")
    _atomic_add(b, sleeping, 1)
    again = b.lshr(_load_atomic(b, nxt), I64(32))
    still = b.and_(b.icmp_unsigned("==", again, seen),
                   b.icmp_signed("==", _load_atomic(b, field(b, pool, "stop")), I64(0)))
    with b.if_then(still):
        call = _Callee(b.inttoptr(_load_atomic(b, field(b, pool, "syscall")), PTR), futex)
        b.call(call, [I64(SYS_FUTEX), gen_word, I32(FUTEX_WAIT_PRIVATE), b.trunc(seen, I32),
                      ir.Constant(PTR, None), ir.Constant(PTR, None), I32(0)])
    _atomic_add(b, sleeping, -1)
    spins.add_incoming(I64(0), b.block)
    b.branch(spin)
    b.position_at_end(new_work)
    take_all(b, pool, gen)
    seen.add_incoming(gen, b.block)
    b.branch(wait)
    b.position_at_end(quit_)
    b.ret_void()

    # md_run_tasks(pool, groups, n)
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR, PTR, I64]), "md_run_tasks")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    pool, groups, n = fn.args
    pair_type = ir.ArrayType(I64, 2)
    busy = field(b, pool, "busy")
    owned = b.extract_value(b.cmpxchg(busy, I64(0), I64(1), "seq_cst", "seq_cst"), 1)
    nxt = field(b, pool, "next")
    gen_word = b.gep(nxt, [I32(1)], source_etype=I32)

    def group(g: ir.Value) -> None:
        tasks = b.inttoptr(b.load(b.gep(groups, [g, I32(0)], source_etype=pair_type), typ=I64), PTR)
        count = b.load(b.gep(groups, [g, I32(1)], source_etype=pair_type), typ=I64)
        shared = b.and_(owned, b.icmp_signed(">", count, I64(1)))
        with b.if_else(shared) as (then, otherwise):
            with then:
                _store_atomic(b, b.ptrtoint(tasks, I64), field(b, pool, "tasks"))
                _store_atomic(b, count, field(b, pool, "count"))
                _store_atomic(b, I64(0), field(b, pool, "done"))
                gen = b.add(b.lshr(_load_atomic(b, nxt), I64(32)), I64(1))
                gen = b.and_(gen, I64(0xFFFFFFFF))
                _store_atomic(b, b.shl(gen, I64(32)), nxt)  # publish: generation, task 0
                with b.if_then(b.icmp_signed(">", _load_atomic(b, field(b, pool, "sleeping")), I64(0))):
                    call = _Callee(b.inttoptr(_load_atomic(b, field(b, pool, "syscall")), PTR), futex)
                    b.call(call, [I64(SYS_FUTEX), gen_word, I32(FUTEX_WAKE_PRIVATE), I32(0x7FFFFFFF),
                                  ir.Constant(PTR, None), ir.Constant(PTR, None), I32(0)])
                take_all(b, pool, gen)
                head = b.append_basic_block("join")
                after = b.append_basic_block("joined")
                b.branch(head)
                b.position_at_end(head)
                finished = b.icmp_signed(">=", _load_atomic(b, field(b, pool, "done")), count)
                waiting = b.append_basic_block("join_pause")
                b.cbranch(finished, after, waiting)
                b.position_at_end(waiting)
                b.call(pause, [])
                b.branch(head)
                b.position_at_end(after)
            with otherwise:
                _loop(b, I64(0), count, lambda i: run_task(b, tasks, i))

    _loop(b, I64(0), n, group)
    with b.if_then(owned):
        _store_atomic(b, I64(0), busy)
    b.ret_void()


__all__ = ["POOL", "POOL_WORDS", "SPIN"]
