#!/usr/bin/env python3
"""Crash soak: a tiny_mod run killed at seeded random moments and resumed with `--resume auto`
until it completes, at one process and under `mpirun -n 2`, must end bitwise equal to an
uninterrupted run (model.safetensors, metrics.csv's deterministic columns, every step once).

Kills are SIGKILL at a random delay (inside a step), on inotify events (a step_N.tmp directory
created: during a checkpoint write; step_N renamed into place: between the rename and `latest`;
metrics.csv.tmp created: during the metrics rewrite a resume does), by the writer's own fault
points (MOD_TEST_HOOKS=1 MOD_CHECKPOINT_FAULT=after_shard|after_metadata|after_rename), and
SIGTERM (checkpoint, exit 75). Some segments put the checkpoints on a tmpfs too small for the
next save (ENOSPC mid-write, in a private mount namespace), then copy them back and go on.
After every segment each complete-looking step_N directory must hold the reference run's shard
bytes, and `latest` must name one of them. docs/reliability.md has the figures.

Usage: crash_soak.py MODTRAIN SOURCE_DIR [--mpiexec MPIEXEC] [--kills N] [--np2-kills N]
                     [--enospc N] [--seed S] [--np1-only] [--keep]
"""
import argparse
import ctypes
import os
import random
import re
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

IN_OPEN, IN_CREATE, IN_MOVED_TO = 0x20, 0x100, 0x80
STEP_DIR = re.compile(r"^step_(\d{8})$")
# Wall-clock and allocator columns: they differ between any two runs, killed or not.
UNTIMED = {"tokens_per_s", "mfu", "peak_memory_mb"}
EVERY = 5  # checkpoint.every_steps


class Inotify:
    """inotify through libc (no third-party modules): the names created or moved into a watched
    directory, read as they happen, so a kill lands within microseconds of the event."""

    def __init__(self):
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.fd = self.libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        self.dirs = {}

    def watch(self, path):
        if path in self.dirs.values():
            return True
        wd = self.libc.inotify_add_watch(self.fd, path.encode(), IN_OPEN | IN_CREATE | IN_MOVED_TO)
        if wd >= 0:
            self.dirs[wd] = path
        return wd >= 0

    def events(self, timeout):
        """[(directory, name, mask)] seen within timeout seconds ([] when none)."""
        if not select.select([self.fd], [], [], timeout)[0]:
            return []
        try:
            data = os.read(self.fd, 1 << 16)
        except BlockingIOError:
            return []
        out, pos = [], 0
        while pos + 16 <= len(data):
            wd, mask, _, n = struct.unpack_from("iIII", data, pos)
            name = data[pos + 16:pos + 16 + n].rstrip(b"\0").decode()
            out.append((self.dirs.get(wd, ""), name, mask))
            pos += 16 + n
        return out

    def close(self):
        os.close(self.fd)


def descendants(pid):
    """Every live process below pid (ranks under mpirun), from /proc."""
    children = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def comm(pid):
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def read(path, mode="r"):
    with open(path, mode) as f:
        return f.read()


def step_of(name):
    m = STEP_DIR.match(name)
    return int(m.group(1)) if m else None


def latest_step(run):
    path = os.path.join(run, "checkpoints", "latest")
    if not os.path.exists(path):
        return 0
    m = re.fullmatch(r"step_(\d{8})\n", read(path))
    return int(m.group(1)) if m else -1


def metrics_rows(run):
    path = os.path.join(run, "metrics.csv")
    if not os.path.exists(path):
        return []
    lines = read(path).split("\n")[1:]
    return [l for l in lines if l]


class Soak:
    def __init__(self, args, work, np, rng, log):
        self.args, self.work, self.np, self.rng, self.log = args, work, np, rng, log
        self.tag = f"np{np}"
        self.ref_seconds = self.startup_seconds = self.seconds = 0.0
        self.kills_done = 0
        self.steps = args.steps if np == 1 else args.np2_steps
        self.kills = args.kills if np == 1 else args.np2_kills
        self.enospc = args.enospc
        self.counts = {}
        self.resumes = self.segments = self.enospc_events = self.leftovers_seen = 0
        self.failures = []
        self.loaded = set()

    # ---- running modtrain ----
    def command(self, run, keep_last, extra=()):
        a = self.args
        small = ["--config", os.path.join(a.source, "configs/recipes/tiny_mod.textproto"),
                 "--data", os.path.join(self.work, "data"),
                 "--set", "model.d_model=64", "--set", "model.n_heads=2", "--set", "model.d_ff=128",
                 "--set", "model.n_layers=2", "--set", "model.seq_len=64",
                 "--set", f"train.steps={self.steps}", "--set", "train.eval_every=50",
                 "--set", "optimizer.warmup_steps=5", "--set", f"checkpoint.every_steps={EVERY}",
                 "--set", f"checkpoint.keep_last={keep_last}"]
        if self.np == 2:
            small += ["--set", "parallel.dp=2"]
        cmd = [a.modtrain, "train", *small, "--run-dir", run, *extra]
        if self.np == 2:
            cmd = [a.mpiexec, "-n", "2", "--oversubscribe", *cmd]
        return cmd

    def reference(self):
        """Two uninterrupted runs: A with the soak's config (its weights and metrics are the
        answer), B keeping every checkpoint (the bytes each step_N's shards must hold)."""
        times = []
        for name, keep in (("ref", 3), ("ref_all", 0)):
            run = os.path.join(self.work, f"{self.tag}_{name}")
            t0, first = time.time(), None
            with open(run + ".log", "w") as out:
                proc = subprocess.Popen(self.command(run, keep), stdout=out, stderr=subprocess.STDOUT)
                while proc.poll() is None:
                    if first is None and metrics_rows(run):
                        first = time.time() - t0
                    time.sleep(0.005)
            if proc.returncode != 0:
                sys.exit(f"crash_soak: {self.tag} reference run failed ({proc.returncode}): "
                         f"{read(run + '.log')[-2000:]}")
            times.append((time.time() - t0, first or 0.0))
        self.ref = os.path.join(self.work, f"{self.tag}_ref")
        self.ref_all = os.path.join(self.work, f"{self.tag}_ref_all")
        self.ref_seconds = times[0][0]
        self.startup_seconds = times[0][1]  # until the first step's metrics row
        self.step_seconds = (times[0][0] - times[0][1]) / self.steps

    # ---- checks ----
    def fail(self, what):
        self.failures.append(what)
        self.log(f"{self.tag} FAIL: {what}")

    def check_checkpoints(self, run, when):
        """Nothing `--resume` would trust is damaged: every step_N (no .tmp) holds the reference
        run's shard bytes and a metadata.pb, and `latest` names one of them."""
        ck = os.path.join(run, "checkpoints")
        if not os.path.isdir(ck):
            return
        names = os.listdir(ck)
        self.leftovers_seen += sum(1 for n in names if n.endswith(".tmp"))
        for name in names:
            step = step_of(name)
            if step is None:
                continue
            mine, ref = os.path.join(ck, name), os.path.join(self.ref_all, "checkpoints", name)
            if not os.path.isdir(ref):  # a SIGTERM's own checkpoint, off the save schedule
                self.check_loads(mine, when)
                continue
            if not os.path.isfile(os.path.join(mine, "metadata.pb")) or \
                    os.path.getsize(os.path.join(mine, "metadata.pb")) == 0:
                self.fail(f"{when}: {name} has no metadata.pb but no .tmp suffix either")
            shards = sorted(n for n in os.listdir(ref) if n.startswith("shard_"))
            if sorted(n for n in os.listdir(mine) if n.startswith("shard_")) != shards:
                self.fail(f"{when}: {name} holds shards {sorted(os.listdir(mine))}, expected {shards}")
                continue
            for s in shards:
                if read(os.path.join(mine, s), "rb") != read(os.path.join(ref, s), "rb"):
                    self.fail(f"{when}: {name}/{s} differs from the uninterrupted run's")
        if os.path.exists(os.path.join(ck, "latest")):
            at = latest_step(run)
            if at < 0:
                self.fail(f"{when}: latest holds {read(os.path.join(ck, 'latest'))!r}")
            elif f"step_{at:08d}" not in names:
                self.fail(f"{when}: latest names step_{at:08d}, which is not there")

    def check_loads(self, ckpt, when):
        """The checkpoint loads whole: export checks metadata.pb's seal and every piece's CRC."""
        key = (ckpt, os.stat(ckpt).st_mtime_ns)
        if key in self.loaded:
            return
        out = os.path.join(self.work, f"{self.tag}_export.safetensors")
        r = subprocess.run([self.args.modtrain, "export", "--checkpoint", ckpt, "--format",
                            "safetensors", "--out", out], capture_output=True, text=True)
        if r.returncode != 0:
            self.fail(f"{when}: {os.path.basename(ckpt)} does not load: {r.stderr.strip()[-500:]}")
        self.loaded.add(key)

    def landed(self, run, t_start):
        """Where a kill landed, from what it left: a fresh step_N.tmp (checkpoint write), a fresh
        step_N beyond `latest` (between the rename and latest), metrics.csv.tmp (metrics
        rewrite), else inside a step."""
        ck = os.path.join(run, "checkpoints")
        names = os.listdir(ck) if os.path.isdir(ck) else []
        fresh = lambda n: os.stat(os.path.join(ck, n)).st_mtime >= t_start
        if os.path.exists(os.path.join(run, "metrics.csv.tmp")):
            return "metrics rewrite"
        if os.path.exists(os.path.join(ck, "latest.tmp")):
            return "latest write"
        if any(n.startswith("step_") and n.endswith(".tmp") and fresh(n) for n in names):
            return "checkpoint write"
        at = latest_step(run)
        if any(step_of(n) is not None and step_of(n) > at and fresh(n) for n in names):
            return "rename..latest"
        return "step"

    # ---- one segment ----
    def victims(self, proc):
        """The processes to signal: modtrain itself, or one rank under mpirun."""
        if self.np == 1:
            return [proc.pid]
        ranks = [p for p in descendants(proc.pid) if comm(p).startswith("modtrain")]
        return ranks

    def segment(self, run, plan):
        env = dict(os.environ)
        if plan.startswith("hook:"):
            env.update(MOD_TEST_HOOKS="1", MOD_CHECKPOINT_FAULT=plan[5:])
        cmd = self.command(run, 3, ["--resume", "auto"])
        if plan == "enospc":
            cmd = self.enospc_wrap(run) + cmd
        log_path = os.path.join(self.work, f"{self.tag}_seg{self.segments:03d}.log")
        self.segments += 1
        rows_before, at_before = len(metrics_rows(run)), latest_step(run)
        # The run directory exists before the first segment, so its checkpoints/ is seen being
        # made: a watch on a missing directory hears nothing, and a fast run then finished
        # before any aimed kill.
        os.makedirs(run, exist_ok=True)
        notify = Inotify()
        notify.watch(run)
        ck = os.path.join(run, "checkpoints")
        if os.path.isdir(ck):
            notify.watch(ck)
        t_start = time.time()
        out = open(log_path, "w")
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
        seen_ranks, sig, aimed = set(), None, plan
        deadline = t_start + max(120.0, 20 * self.ref_seconds)
        # Random delays cover startup plus about 20 steps, so most kills lose a few steps.
        delay = self.rng.uniform(0.3 * self.startup_seconds, self.startup_seconds + 20 * self.step_seconds)
        nth = self.rng.randint(1, 4)  # which save (or rename) of the segment to kill at
        micro = self.rng.uniform(0.0, 0.002)  # a little into the write, not always at its start
        rank_pick = self.rng.randrange(self.np)
        count = 0
        give_up = t_start + 2 * self.startup_seconds + 1.0 + 2 * (nth + 1) * EVERY * self.step_seconds
        if plan == "metrics_rewrite" and rows_before <= at_before:
            aimed = plan = "step"  # nothing beyond the checkpoint to drop: no rewrite happens
        while proc.poll() is None and sig is None:
            if time.time() > deadline:
                self.fail(f"segment {self.segments - 1} ({plan}) ran past {deadline - t_start:.0f} s")
                break
            for p in descendants(proc.pid) if self.np == 2 else []:
                seen_ranks.add(p)
            if plan in ("step", "sigterm"):
                # SIGTERM once training runs (before, the default action ends the process).
                started = plan == "step" or "| loss" in read(log_path)
                if time.time() - t_start >= delay and started and (self.np == 1 or self.victims(proc)):
                    sig = signal.SIGTERM if plan == "sigterm" else signal.SIGKILL
                else:
                    time.sleep(0.002)
                continue
            # No event came (the run nears its end). Hooks and a full disk end the process by
            # themselves, however slow the machine: they are waited for, never replaced.
            self_ending = plan in ("none", "enospc") or plan.startswith("hook:")
            if not self_ending and time.time() > give_up:
                aimed, sig = "random delay (no event)", signal.SIGKILL
                break
            for d, name, mask in notify.events(0.05):
                if d == run and name == "checkpoints":
                    notify.watch(ck)
                if plan == "ckpt_write" and d == ck and re.match(r"step_\d{8}\.tmp$", name) and mask & IN_CREATE:
                    count += 1
                elif plan == "rename_latest" and d == ck and STEP_DIR.match(name) and mask & IN_MOVED_TO:
                    count += 1
                elif plan == "metrics_rewrite" and d == run and name == "metrics.csv.tmp" and \
                        mask & (IN_CREATE | IN_OPEN):  # a leftover .tmp is opened, not created
                    count = nth
                if count >= nth:
                    if plan == "ckpt_write":
                        time.sleep(micro)
                    sig = signal.SIGKILL
                    break
        if sig is not None:
            targets = self.victims(proc)
            if targets:
                victim = targets[rank_pick % len(targets)]
                try:
                    os.kill(victim, sig)
                except ProcessLookupError:
                    sig = None
            else:
                sig = None
        try:
            rc = proc.wait(timeout=max(60.0, 10 * self.ref_seconds))
        except subprocess.TimeoutExpired:
            self.fail(f"segment {self.segments - 1} ({plan}) did not end after the signal")
            os.killpg(proc.pid, signal.SIGKILL)
            rc = proc.wait()
        out.close()
        # An orphaned rank must not write into the run directory while the next segment runs.
        for p in seen_ranks:
            for _ in range(1000):
                if not alive(p):
                    break
                time.sleep(0.01)
            else:
                self.fail(f"rank process {p} outlived mpirun by 10 s")
                os.kill(p, signal.SIGKILL)
        text = read(log_path)
        if "resumed from" in text:
            self.resumes += 1
        return aimed, sig, rc, text, t_start

    # ---- ENOSPC ----
    def enospc_wrap(self, run):
        """A shell in a private mount namespace that puts a tmpfs with room for what is there plus
        half a checkpoint over run/checkpoints, runs the command, and copies the result back."""
        ck = os.path.join(run, "checkpoints")
        os.makedirs(ck, exist_ok=True)
        used = 0  # KiB in pages; leftovers (*.tmp) do not count: the next save removes them
        for root, _, files in os.walk(ck):
            if ".tmp" in os.path.relpath(root, ck):
                continue
            for f in files:
                if not f.endswith(".tmp"):
                    used += (os.path.getsize(os.path.join(root, f)) + 4095) // 4096 * 4
        ckpt_kb = sum(os.path.getsize(os.path.join(self.ref_all, "checkpoints", f"step_{EVERY:08d}", n))
                      for n in os.listdir(os.path.join(self.ref_all, "checkpoints", f"step_{EVERY:08d}"))) // 1024
        size_kb = used + 64 + ckpt_kb // 2
        mnt = os.path.join(self.work, "enospc_mnt")
        os.makedirs(mnt, exist_ok=True)
        # Leftovers are not copied in (they would not fit). The tmpfs and the bind mount vanish
        # with the namespace; what the run left on the tmpfs is copied back first, as it was.
        script = ('set -e; ck=$1; mnt=$2; mount -t tmpfs -o size="$3"k soak "$mnt"; '
                  'for f in "$ck"/*; do [ -e "$f" ] || continue; case "$f" in *.tmp) ;; *) cp -a "$f" "$mnt"/ ;; esac; done; '
                  'mount --bind "$mnt" "$ck"; shift 3; '
                  'set +e; "$@"; rc=$?; set -e; umount "$ck"; '
                  'find "$ck" -mindepth 1 -delete; cp -a "$mnt"/. "$ck"/; exit $rc')
        return self.ns_prefix + ["sh", "-c", script, "sh", ck, mnt, str(size_kb)]

    # ---- the soak ----
    def plans(self):
        """The kinds of kill, drawn per segment with these weights."""
        return [("step", 4), ("ckpt_write", 2), ("rename_latest", 1), ("metrics_rewrite", 2),
                ("hook:after_shard", 1), ("hook:after_metadata", 1), ("hook:after_rename", 1),
                ("sigterm", 2)]

    def run(self):
        self.reference()
        run = os.path.join(self.work, f"{self.tag}_soak")
        os.makedirs(run)
        kinds, weights = zip(*self.plans())
        enospc_at = set(self.rng.sample(range(1, self.kills + 1), min(self.enospc, self.kills)))
        if not self.ns_prefix:
            enospc_at = set()
        kills = 0
        t0 = time.time()
        for _ in range(4 * self.kills + 40):
            if kills in enospc_at:
                enospc_at.discard(kills)
                plan = "enospc"
            elif kills < self.kills:
                plan = self.rng.choices(kinds, weights)[0]
            else:
                plan = "finish"
            at = latest_step(run)
            aimed, sig, rc, text, t_start = self.segment(run, plan if plan != "finish" else "none")
            where = self.landed(run, t_start)
            seg = self.segments - 1
            if plan == "enospc":
                full = text.count("No space left on device") > 0
                if full:
                    self.enospc_events += 1
                    self.count("ENOSPC", "tmpfs full", "checkpoint write")
                if rc == 0:
                    self.log(f"{self.tag} seg {seg}: enospc: the run finished without filling the disk")
                elif not full:
                    self.fail(f"segment {seg} (ENOSPC): exit {rc} without 'No space left on device': {text[-1500:]}")
                if latest_step(run) != at:
                    self.fail(f"segment {seg} (ENOSPC): latest moved from {at} to {latest_step(run)}")
                self.log(f"{self.tag} seg {seg}: ENOSPC tmpfs, exit {rc}, latest {at} -> {latest_step(run)}")
            elif rc == 0:
                self.log(f"{self.tag} seg {seg}: {aimed}: the run finished (exit 0) "
                         f"{'before the signal' if plan != 'finish' else ''}".rstrip())
            elif aimed == "sigterm" and sig is not None:
                kills += 1
                self.count("SIGTERM", "random delay", where)
                if rc != 75:
                    self.fail(f"segment {seg}: SIGTERM: exit {rc}, expected 75: {text[-1500:]}")
                rows = metrics_rows(run)
                if rows and int(rows[-1].split(",")[0]) != latest_step(run):
                    self.fail(f"segment {seg}: SIGTERM: stopped after step {rows[-1].split(',')[0]}, "
                              f"latest is {latest_step(run)}")
                self.log(f"{self.tag} seg {seg}: SIGTERM at step ~{len(rows)}, exit {rc}, "
                         f"latest {at} -> {latest_step(run)}")
            elif aimed.startswith("hook:") or sig == signal.SIGKILL:
                kills += 1
                how = aimed if aimed.startswith(("hook:", "random")) else f"{aimed} (inotify)" if aimed != "step" else "random delay"
                self.count("SIGKILL", how, where)
                if rc not in (-9, 137, 9) and not (self.np == 2 and rc != 0):
                    self.fail(f"segment {seg}: {how}: exit {rc}, expected death by SIGKILL: {text[-1500:]}")
                self.log(f"{self.tag} seg {seg}: SIGKILL {how}: landed in {where}, "
                         f"{time.time() - t0:6.1f} s, exit {rc}, latest {at} -> {latest_step(run)}")
            else:
                self.fail(f"segment {seg} ({aimed}): exit {rc} with no signal sent: {text[-2000:]}")
                break
            self.check_checkpoints(run, f"after segment {seg}")
            if self.failures:
                break
            if rc == 0 and plan not in ("enospc",):
                break
        else:
            self.fail("the soak did not finish within its segment budget")
        if kills < self.kills and not self.failures:
            self.fail(f"the run finished after {kills} of {self.kills} kills: give it more --steps")
        self.seconds = time.time() - t0
        self.kills_done = kills
        if not self.failures:  # after a failure the run stopped early; the rest would only echo it
            self.final_checks(run)

    def count(self, sig, aim, where):
        self.counts[(sig, aim, where)] = self.counts.get((sig, aim, where), 0) + 1

    def final_checks(self, run):
        if latest_step(run) != self.steps:
            self.fail(f"the soak ended at latest {latest_step(run)}, not step {self.steps}")
            return
        mine = os.path.join(run, "model.safetensors")
        if not os.path.exists(mine) or read(mine, "rb") != read(os.path.join(self.ref, "model.safetensors"), "rb"):
            self.fail("model.safetensors differs from the uninterrupted run's")
        ref_lines = read(os.path.join(self.ref, "metrics.csv")).split("\n")
        lines = read(os.path.join(run, "metrics.csv")).split("\n")
        if lines[0] != ref_lines[0]:
            self.fail(f"metrics.csv header differs: {lines[0]!r}")
        cols = [i for i, c in enumerate(lines[0].split(",")) if c not in UNTIMED]
        steps = [int(l.split(",")[0]) for l in lines[1:] if l]
        if steps != list(range(1, self.steps + 1)):
            dup = sorted({s for s in steps if steps.count(s) > 1})
            missing = sorted(set(range(1, self.steps + 1)) - set(steps))
            self.fail(f"metrics.csv steps: duplicated {dup[:10]}, missing {missing[:10]}, "
                      f"{len(steps)} rows for {self.steps} steps")
        pick = lambda ls: [[l.split(",")[i] for i in cols] for l in ls[1:] if l]
        if pick(lines) != pick(ref_lines):
            bad = next(i for i, (a, b) in enumerate(zip(pick(lines), pick(ref_lines))) if a != b) \
                if len(lines) == len(ref_lines) else -1
            self.fail(f"metrics.csv's deterministic columns differ (first at row {bad + 1})")
        self.check_checkpoints(run, "at the end")
        # Every checkpoint left must load whole.
        ck = os.path.join(run, "checkpoints")
        for name in sorted(os.listdir(ck)):
            if step_of(name) is not None:
                self.check_loads(os.path.join(ck, name), "at the end")

    def summary(self):
        lines = [f"{self.tag}: {self.kills_done} kills over {self.segments} segments, {self.resumes} "
                 f"resumes from a checkpoint, {self.enospc_events} ENOSPC events, {self.leftovers_seen} "
                 f".tmp leftovers seen, {self.seconds:.1f} s (uninterrupted run {self.ref_seconds:.1f} s, "
                 f"{self.steps} steps, startup {self.startup_seconds:.1f} s)"]
        lines.append(f"  {'signal':8s} {'aimed at':30s} {'left on disk':18s} count")
        for (sig, aim, where), n in sorted(self.counts.items()):
            lines.append(f"  {sig:8s} {aim:30s} {where:18s} {n:5d}")
        return "\n".join(lines)


def namespace_prefix(work):
    """The command prefix that gives a private mount namespace where tmpfs can be mounted:
    `unshare -m` as root, `unshare -rm` (a user namespace) otherwise; [] when neither works."""
    probe = os.path.join(work, "probe")
    os.makedirs(probe, exist_ok=True)
    for prefix in (["unshare", "-m"], ["unshare", "-rm"]):
        if prefix == ["unshare", "-m"] and os.geteuid() != 0:
            continue
        try:
            r = subprocess.run(prefix + ["sh", "-c", f'mount -t tmpfs -o size=64k soak "{probe}"'],
                               capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if r.returncode == 0:
            return prefix
    return []


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("modtrain")
    ap.add_argument("source")
    ap.add_argument("--mpiexec", default="", help="mpiexec for the np2 soak (none: np1 only)")
    ap.add_argument("--kills", type=int, default=15, help="signals sent to the one-process run")
    ap.add_argument("--np2-kills", type=int, default=6, help="signals sent to the mpirun -n 2 run")
    ap.add_argument("--enospc", type=int, default=1, help="segments per soak on a full tmpfs")
    ap.add_argument("--steps", type=int, default=0, help="training steps (default: from --kills)")
    ap.add_argument("--np2-steps", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0, help="0: from the clock (printed)")
    ap.add_argument("--np1-only", action="store_true")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    args = ap.parse_args()
    args.seed = args.seed or int(time.time()) % 100000
    # About 7 steps are gained per kill on average; the rest runs after the last one.
    args.steps = args.steps or 12 * args.kills + 40
    args.np2_steps = args.np2_steps or 12 * args.np2_kills + 40
    args.modtrain = os.path.abspath(args.modtrain)
    os.environ.update(OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                      OMPI_MCA_btl_tcp_if_include="lo", OMPI_MCA_oob_tcp_if_include="lo",
                      MOD_COLLECTIVE_TIMEOUT_S="60")
    for var in ("MOD_TEST_HOOKS", "MOD_CHECKPOINT_FAULT"):
        os.environ.pop(var, None)
    work = tempfile.mkdtemp(prefix="crash_soak.")
    t0 = time.time()
    log_file = open(os.path.join(work, "soak.log"), "w")

    def log(line):
        line = f"[{time.time() - t0:7.1f}] {line}"
        print(line, flush=True)
        log_file.write(line + "\n")

    log(f"crash_soak: seed {args.seed}, work {work}")
    src = args.source
    with open(os.path.join(work, "corpus.txt"), "wb") as corpus:
        for d in ("core", "docs"):
            for name in sorted(os.listdir(os.path.join(src, d))):
                if name.endswith((".cpp", ".h", ".md")):
                    corpus.write(read(os.path.join(src, d, name), "rb"))
    subprocess.run([args.modtrain, "prep", "--input", os.path.join(work, "corpus.txt"), "--out",
                    os.path.join(work, "data"), "--val-fraction", "0.1"], check=True,
                   stdout=subprocess.DEVNULL)
    prefix = namespace_prefix(work)
    if prefix:
        log(f"ENOSPC: checkpoints on a small tmpfs in a private mount namespace ({' '.join(prefix)})")
    else:
        log("ENOSPC: skipped: neither `unshare -m` (root) nor `unshare -rm` can mount a tmpfs here")
    nps = [1] if args.np1_only or not args.mpiexec else [1, 2]
    if 2 not in nps:
        log("np2: skipped (" + ("--np1-only" if args.np1_only else "no --mpiexec") + ")")
    rng = random.Random(args.seed)
    soaks = []
    for np in nps:
        soak = Soak(args, work, np, rng, log)
        soak.ns_prefix = prefix
        soak.run()
        soaks.append(soak)
        if soak.failures:
            break
    print("\ncrash_soak summary (seed %d):" % args.seed)
    for s in soaks:
        print(s.summary())
    print(f"metrics.csv compared on every column but {', '.join(sorted(UNTIMED))} (wall clock, allocator)")
    print(f"total {time.time() - t0:.1f} s")
    failures = [f"{s.tag}: {f}" for s in soaks for f in s.failures]
    log_file.close()
    if failures:
        print("crash_soak: FAILED (work directory kept: %s)\n  %s" % (work, "\n  ".join(failures[:20])))
        sys.exit(1)
    print("crash_soak: all checks passed")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
