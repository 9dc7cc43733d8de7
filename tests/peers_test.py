"""parallel/peers.py on a fake coordination service and a hand-driven clock: who is lost, when,
and the line that says so (the real two-process faults: tests/pod_faults_test.py)."""

from rlver_jax.parallel import peers
from rlver_jax.parallel.distributed import DistributedSettings


class FakeService:
    """A key-value store; `down` makes every call fail as an unreachable service does."""

    def __init__(self):
        self.values: dict[str, str] = {}
        self.down = False

    def key_value_set(self, key, value, allow_overwrite=False):
        if self.down:
            raise RuntimeError("UNAVAILABLE: failed to connect to all addresses")
        self.values[key] = value

    def key_value_try_get(self, key):
        if self.down:
            raise RuntimeError("UNAVAILABLE: failed to connect to all addresses")
        if key not in self.values:
            raise RuntimeError(f"NOT_FOUND: Config key {key} not found")
        return self.values[key]


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def _watch(service, me, n=3, timeout=10.0):
    clock = Clock()
    watch = peers.PeerWatch(service, me, n, timeout_s=timeout, on_lost=lambda lost: None, clock=clock)
    return watch, clock


def test_a_peer_that_stops_beating_is_lost_after_the_timeout_and_not_before():
    service = FakeService()
    watch, clock = _watch(service, 0)
    for t in range(0, 30, 2):  # processes 1 and 2 beat every 2 s; process 2 freezes at t = 10
        clock.now = 100.0 + t
        service.values["rlver_jax/alive/1"] = str(t)
        if t <= 10:
            service.values["rlver_jax/alive/2"] = str(t)
        watch.beat()
        lost = watch.check()
        assert (lost is None) == (t - 10 <= 10), t  # silent 10 s is still alive; 12 s is lost
    assert lost == peers.Lost((2,), "was lost: it stopped answering", 18.0)
    assert peers.describe(lost) == "process 2 was lost: it stopped answering (no heartbeat for 18 s)"
    assert service.values["rlver_jax/alive/0"] == str(15)  # its own counter, once a round
    assert watch.silent_now(within_s=5.0) == (2,)


def test_a_peer_that_never_published_counts_from_the_start():
    service = FakeService()
    watch, clock = _watch(service, 1, n=2, timeout=10.0)
    watch.beat()
    clock.now += 10.5
    watch.beat()
    assert watch.check() == peers.Lost((0,), "was lost: it stopped answering", 10.5)


def test_an_unreachable_coordinator_is_named_as_such():
    service = FakeService()
    watch, clock = _watch(service, 1, n=2, timeout=10.0)
    service.values["rlver_jax/alive/0"] = "1"
    watch.beat()
    service.down = True
    clock.now += 11
    watch.beat()
    lost = watch.check()
    assert lost.processes == (0,) and lost.why == "the coordinator stopped answering"
    assert peers.describe(lost) == "the coordinator stopped answering (process 0, no answer for 11 s)"


def test_the_runtime_heartbeat_is_set_above_the_watch():
    args = DistributedSettings(coordinator_address="h:1", num_processes=2, process_id=0,
                               peer_timeout_s=20).initialize_arguments()
    assert args["heartbeat_timeout_seconds"] == 80 > 20
