"""Sandbox uids come from one record per machine (sandbox/launch/uids.py), not from a hash of
the id: a plugin cannot pick an id that lands on another sandbox's uid, two
supervisors never share one, and a uid still in use by a process is never handed on.

Each test uses a registry of its own under a temporary folder, never /var/lib.
"""

from __future__ import annotations

import multiprocessing
import grp
import os
import pwd
import shutil
import subprocess
import tempfile
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from clawsup.sandbox.launch.uids import SandboxUids, UidAllocator, UidRegistryError
from tests.conftest import IN_CI, Gateway, make_config, require_backend, wait_gone

# Far from the default range, so a test never meets a real supervisor's sandboxes.
TEST_FIRST = 1_950_000_000


def _need_root() -> None:
    if os.geteuid() != 0:
        if IN_CI:
            pytest.fail("CI runs as root: the uid tests must run there")
        pytest.skip("needs root")


@pytest.fixture
def registry(tmp_path: Path) -> Path:
    return tmp_path / "reg" / "uids.json"


@pytest.fixture
def states(tmp_path: Path) -> list[Path]:
    out = [tmp_path / f"state{i}" for i in range(4)]
    for d in out:
        d.mkdir()
    return out


def _crc_pair() -> tuple[str, str]:
    """Two ids whose old hashed uids (crc32 mod 10^6) were the same."""
    seen: dict[int, str] = {}
    for i in range(100_000):
        sid = f"p{i}"
        h = zlib.crc32(sid.encode()) % 10**6
        if h in seen:
            return seen[h], sid
        seen[h] = sid
    raise AssertionError("no crc32 collision mod 10^6 in 100000 ids")


def _system_ids() -> set[int]:
    return {p.pw_uid for p in pwd.getpwall()} | {g.gr_gid for g in grp.getgrall()}


def _live_ids() -> set[int]:
    out: set[int] = set()
    for p in psutil.process_iter(["uids", "gids"]):
        out.update(p.info["uids"] or ())
        out.update(p.info["gids"] or ())
    return out


@pytest.fixture
def run_as() -> Iterator[object]:
    """`run_as(uid)` starts a real process whose uids are all `uid` (setuid in the
    child before exec); every one is killed at the end."""
    started: list[subprocess.Popen[bytes]] = []

    def start(uid: int) -> subprocess.Popen[bytes]:
        _need_root()
        # Popen returns only once the child has exec'd, so its setuid is done.
        p = subprocess.Popen(["sleep", "600"], user=uid, group=uid, extra_groups=[], stdin=subprocess.DEVNULL)
        started.append(p)
        assert psutil.Process(p.pid).uids() == (uid, uid, uid)
        return p

    yield start
    for p in started:
        p.kill()
        p.wait(10)


def test_many_ids_get_distinct_uids_even_those_whose_hashes_collided(registry: Path, states: list[Path]) -> None:
    a, b = _crc_pair()
    ids = [f"sandbox-{i}" for i in range(2000)] + [a, b]
    users = UidAllocator(registry, TEST_FIRST, 1_000_000).allocate_many(states[0], ids)
    assert set(users) == set(ids)
    uids = [u.uid for u in users.values()]
    assert len(set(uids)) == len(ids)
    assert users[a].uid != users[b].uid
    assert all(TEST_FIRST <= u.uid < TEST_FIRST + 1_000_000 and u.gid == u.uid for u in users.values())
    assert not set(uids) & _system_ids()


def test_two_supervisors_with_the_same_ids_get_distinct_uids(registry: Path, states: list[Path]) -> None:
    ids = ["basics", "chaos", "workspace-main"]
    # Two supervisors: two allocators (as in two processes), one record.
    one = SandboxUids(UidAllocator(registry, TEST_FIRST, 1000), states[0]).users(ids)
    two = SandboxUids(UidAllocator(registry, TEST_FIRST, 1000), states[1]).users(ids)
    assert not {u.uid for u in one.values()} & {u.uid for u in two.values()}


def test_the_same_key_gets_the_same_uid_at_every_start(registry: Path, states: list[Path]) -> None:
    ids = [f"p{i}" for i in range(50)]
    first = UidAllocator(registry, TEST_FIRST, 1000).allocate_many(states[0], ids)
    # Others come and go in between; a restart asks in another order, or for some.
    UidAllocator(registry, TEST_FIRST, 1000).allocate_many(states[1], ids)
    UidAllocator(registry, TEST_FIRST, 1000).release(states[1], "p3")
    again = UidAllocator(registry, TEST_FIRST, 1000).allocate_many(states[0], list(reversed(ids)))
    assert again == first
    assert SandboxUids(UidAllocator(registry, TEST_FIRST, 1000), states[0]).user("p7") == first["p7"]
    # The key is the resolved state directory: another spelling of it is the same.
    assert UidAllocator(registry, TEST_FIRST, 1000).allocate(states[0] / ".." / states[0].name, "p7") == first["p7"]


def test_a_released_uid_comes_back_only_after_the_range_has_come_round(registry: Path, states: list[Path]) -> None:
    alloc = UidAllocator(registry, TEST_FIRST, 3)
    a = alloc.allocate(states[0], "subagent-1").uid
    alloc.release(states[0], "subagent-1")
    b = alloc.allocate(states[0], "subagent-2").uid
    c = alloc.allocate(states[0], "subagent-3").uid
    assert len({a, b, c}) == 3
    assert alloc.allocate(states[0], "subagent-4").uid == a
    assert set(alloc.holders()) == {(str(states[0].resolve()), f"subagent-{i}") for i in (2, 3, 4)}


def test_a_uid_with_a_live_process_is_never_given_to_another_key(registry: Path, states: list[Path], run_as) -> None:
    _need_root()
    alloc = UidAllocator(registry, TEST_FIRST, 2)
    held = alloc.allocate(states[0], "victim").uid
    proc = run_as(held)
    alloc.release(states[0], "victim")
    other = alloc.allocate(states[0], "intruder").uid
    assert other != held
    # The only uid of the range not held is the one whose process still lives.
    with pytest.raises(UidRegistryError, match="no free uid left"):
        alloc.allocate(states[1], "intruder")
    assert psutil.Process(proc.pid).uids().real == held
    proc.kill()
    proc.wait(10)
    assert alloc.allocate(states[1], "intruder").uid == held


def test_uids_of_users_and_of_processes_never_recorded_are_skipped(registry: Path, states: list[Path], run_as) -> None:
    _need_root()
    system, live = _system_ids(), _live_ids()
    user = next(u for u in sorted(system) if 0 < u and u + 1 not in system | live and u + 1 < 2**31)
    assert UidAllocator(registry, user, 2).allocate(states[0], "a").uid == user + 1
    stranger = TEST_FIRST + 500
    run_as(stranger)
    assert UidAllocator(registry, stranger, 2).allocate(states[0], "b").uid == stranger + 1


def _allocate_and_exit(registry: str, states: list[str], out: object) -> None:
    alloc = UidAllocator(Path(registry), TEST_FIRST, 100)
    out.put({state: alloc.allocate(state, "a").uid for state in states})  # type: ignore[attr-defined]


def test_keys_of_a_removed_state_directory_are_reclaimed_unless_still_in_use(registry: Path, tmp_path: Path, run_as) -> None:
    _need_root()
    gone_idle, gone_busy, gone_asked, kept = (tmp_path / n for n in ("gone-idle", "gone-busy", "gone-asked", "kept"))
    for d in (gone_idle, gone_busy, gone_asked, kept):
        d.mkdir()
    # Asked for by a supervisor that has exited since...
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_allocate_and_exit, args=(str(registry), [str(gone_idle), str(gone_busy), str(kept)], out))
    child.start()
    uids = out.get(timeout=60)
    child.join(30)
    assert child.exitcode == 0
    run_as(uids[str(gone_busy)])
    # ...and by one that lives (us): its state directory may just be out of sight.
    alloc = UidAllocator(registry, TEST_FIRST, 100)
    alloc.allocate(gone_asked, "a")
    for d in (gone_idle, gone_busy, gone_asked):
        d.rmdir()
    alloc.allocate(kept, "b")  # a new key: the record is tidied then
    assert {k[0] for k in alloc.holders()} == {str(d.resolve()) for d in (gone_busy, gone_asked, kept)}


def test_a_registry_planted_as_a_symlink_is_refused(registry: Path, states: list[Path], tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    registry.parent.mkdir(mode=0o700)
    registry.symlink_to(victim)
    with pytest.raises(UidRegistryError, match="is a symlink"):
        UidAllocator(registry, TEST_FIRST, 10).allocate(states[0], "a")
    assert victim.read_text() == "precious\n"
    assert registry.is_symlink()


def test_a_registry_folder_planted_as_a_symlink_is_refused(tmp_path: Path, states: list[Path]) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (tmp_path / "reg").symlink_to(elsewhere)
    with pytest.raises(UidRegistryError, match="folder .* is a symlink"):
        UidAllocator(tmp_path / "reg" / "uids.json", TEST_FIRST, 10).allocate(states[0], "a")
    assert list(elsewhere.iterdir()) == []


def test_a_registry_planted_as_a_fifo_is_refused_without_blocking(registry: Path, states: list[Path]) -> None:
    registry.parent.mkdir(mode=0o700)
    os.mkfifo(registry, 0o600)
    outcome: list[BaseException] = []

    def attempt() -> None:
        try:
            UidAllocator(registry, TEST_FIRST, 10).allocate(states[0], "a")
        except BaseException as e:
            outcome.append(e)

    t = threading.Thread(target=attempt, daemon=True)
    t.start()
    t.join(20)
    assert not t.is_alive(), "allocation blocked on a FIFO"
    assert len(outcome) == 1 and isinstance(outcome[0], UidRegistryError) and "not a regular file" in str(outcome[0])


def test_a_registry_or_folder_others_own_or_can_write_is_refused(registry: Path, states: list[Path]) -> None:
    _need_root()
    alloc = UidAllocator(registry, TEST_FIRST, 10)
    alloc.allocate(states[0], "a")
    os.chown(registry, 1234, 1234)
    with pytest.raises(UidRegistryError, match="belongs to uid 1234, not to us"):
        alloc.allocate(states[0], "b")
    os.chown(registry, 0, 0)
    os.chmod(registry.parent, 0o777)
    with pytest.raises(UidRegistryError, match="folder .* has mode 777"):
        alloc.allocate(states[0], "b")


def test_a_damaged_registry_is_refused_and_left_as_it_is(registry: Path, states: list[Path]) -> None:
    registry.parent.mkdir(mode=0o700)
    registry.write_text('{"format": 1, "cursor": null, "holders": [{"state": "/x", "id": "a", "uid": 5}, {"state": "/y", "id": "b", "uid": 5}]}')
    os.chmod(registry, 0o600)
    before = registry.read_text()
    with pytest.raises(UidRegistryError, match="not one clawsup wrote .*a uid is recorded for two sandboxes"):
        UidAllocator(registry, TEST_FIRST, 10).allocate(states[0], "a")
    assert registry.read_text() == before


def _allocate_in_child(registry: str, state: str, start: object, out: object) -> None:
    alloc = UidAllocator(Path(registry), TEST_FIRST, 100_000)
    start.wait(30)  # type: ignore[attr-defined]
    got: dict[str, int] = {}
    # Small batches and single ids, so the processes' visits to the record interleave.
    for batch in range(10):
        ids = [f"s{batch}-{i}" for i in range(10)]
        got.update({k: u.uid for k, u in alloc.allocate_many(state, ids).items()})
        got[f"one-{batch}"] = alloc.allocate(state, f"one-{batch}").uid
    out.put((state, got))  # type: ignore[attr-defined]


def test_processes_allocating_at_once_get_distinct_uids(registry: Path, states: list[Path]) -> None:
    ctx = multiprocessing.get_context("fork")
    start, out = ctx.Barrier(len(states)), ctx.Queue()
    procs = [ctx.Process(target=_allocate_in_child, args=(str(registry), str(s), start, out)) for s in states]
    for p in procs:
        p.start()
    results = dict(out.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    every = [uid for got in results.values() for uid in got.values()]
    assert len(every) == len(states) * 110 and len(set(every)) == len(every)
    recorded = UidAllocator(registry, TEST_FIRST, 100_000).holders()
    assert recorded == {(state, sid): uid for state, got in results.items() for sid, uid in got.items()}


# -- end to end: two real supervisors ------------------------------------------------


@pytest.fixture
def two_states() -> Iterator[list[Path]]:
    # Short on purpose: unix socket paths hold 108 bytes.
    dirs = [Path(tempfile.mkdtemp(prefix="cs-", dir="/tmp")) for _ in range(2)]
    yield dirs
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)


def test_two_supervisors_running_the_same_plugin_give_it_different_uids(two_states: list[Path], tmp_path: Path) -> None:
    _need_root()
    require_backend("bwrap")
    registry = tmp_path / "reg" / "uids.json"
    cfg = make_config(
        sandbox__defaults__backend="bwrap",
        sandbox__uids={"registry": str(registry)},
        agents__defaults__sandbox={"scope": "session", "backend": "bwrap"},
    )
    gateways: list[Gateway] = []
    try:
        for state in two_states:
            gateways.append(Gateway(state, cfg, []))
        seen = []
        for gw in gateways:
            assert gw.wait("basics", "ready") == "ready"
            hosts = gw.host_pids()
            assert len(hosts) == 1, hosts
            uid = psutil.Process(hosts[0]).uids().real
            # The victim's side: its workspace belongs to its own uid, which the
            # other supervisor's sandbox does not have.
            assert (gw.state / "sandboxes" / "basics" / "workspace").stat().st_uid == uid
            seen.append(uid)
        assert seen[0] != seen[1] and 0 not in seen
        recorded = UidAllocator(registry).holders()
        assert recorded[(str(two_states[0].resolve()), "basics")] == seen[0]
        assert recorded[(str(two_states[1].resolve()), "basics")] == seen[1]
        # A restart of the first keeps its uid, so the workspace keeps its owner.
        first = gateways.pop(0)
        assert first.stop() == 0
        wait_gone(first.host_pids())
        gateways.append(Gateway(two_states[0], cfg, []))
        assert gateways[-1].wait("basics", "ready") == "ready"
        assert psutil.Process(gateways[-1].host_pids()[0]).uids().real == seen[0]
    finally:
        for gw in gateways:
            try:
                gw.stop()
            except Exception:
                gw.kill()


def test_a_bad_range_is_refused_with_the_setting_named(registry: Path) -> None:
    with pytest.raises(UidRegistryError, match="sandbox.uids: first 0"):
        UidAllocator(registry, 0, 10)
    with pytest.raises(UidRegistryError, match="sandbox.uids.registry"):
        UidAllocator(Path("relative/uids.json"))

