"""OpenStack's etcd3gw (Debian's python3-etcd3gw) against one endpoint, as
its users call it: every call it makes goes through the HTTP/JSON gateway.
Exits non-zero with the failing check on stderr."""

import sys
import threading

import etcd3gw  # noqa: F401 (the package under test)
from etcd3gw.client import Etcd3Client
from etcd3gw.exceptions import WatchTimedOut
from etcd3gw.lock import Lock

host, port = sys.argv[1], int(sys.argv[2])
# etcd 3.4 serves /v3/ (etcd3gw defaults to 3.3's /v3alpha/), as its users configure.
c = Etcd3Client(host=host, port=port, api_path="/v3/")


def _times_out(client):
    try:
        client.watch_once("/gw/quiet", timeout=0.5)
    except WatchTimedOut:
        return True
    return False


def check(what, ok):
    if not ok:
        sys.exit(f"etcd3gw: {what}")
    print(f"ok: {what}")


check("status names a leader", int(c.status()["leader"]) != 0)
check("members lists one", len(c.members()) >= 1)

# put, get, get with metadata, prefix, delete
check("put", c.put("/gw/a", "1"))
check("get", c.get("/gw/a") == [b"1"])
value, meta = c.get("/gw/a", metadata=True)[0]
check("get metadata", value == b"1" and meta["key"] == b"/gw/a" and int(meta["version"]) == 1)
c.put("/gw/b", "2")
c.put("/gw/c", "3")
check("get_prefix", sorted(v for v, _ in c.get_prefix("/gw/")) == [b"1", b"2", b"3"])
check("create refuses an existing key", c.create("/gw/a", "x") is False)
check("create makes a new key", c.create("/gw/new", "n") is True)

# compare-and-swap
check("replace with the wrong old value fails", c.replace("/gw/a", "nope", "9") is False)
check("replace with the right old value", c.replace("/gw/a", "1", "9") is True)
check("replaced", c.get("/gw/a") == [b"9"])
check("delete", c.delete("/gw/a") is True)
check("deleted", c.get("/gw/a") == [])
check("delete_prefix", c.delete_prefix("/gw/") is not None and c.get_prefix("/gw/") == [])

# leases
lease = c.lease(ttl=30)
check("lease granted", lease.id != 0)
c.put("/gw/leased", "l", lease=lease)
check("lease keys", lease.keys() == [b"/gw/leased"])
check("lease ttl", 0 < lease.ttl() <= 30)
check("lease refresh", lease.refresh() == 30)
check("lease revoke", lease.revoke() is True)
check("revoked lease's key gone", c.get("/gw/leased") == [])

# the lock recipe
first = Lock("gw-lock", ttl=30, client=c)
second = Lock("gw-lock", ttl=30, client=c)
check("lock acquired", first.acquire() is True)
check("lock held by another is refused", second.acquire() is False)
check("lock released", first.release() is True)
check("lock then free", second.acquire() is True and second.release() is True)

# watch: events of a prefix, from the revision after the last write, so none
# is missed while the watch registers
after = int(c.status()["header"]["revision"]) + 1
events, cancel = c.watch_prefix("/gw/w/", start_revision=after)
seen = []
done = threading.Event()


def collect():
    for event in events:
        seen.append(event)
        if len(seen) == 3:
            done.set()
            return


threading.Thread(target=collect, daemon=True).start()
for i in range(3):
    c.put(f"/gw/w/{i}", str(i))
check("watch saw three events", done.wait(20))
cancel()
kinds = [(e.get("type", "PUT"), e["kv"]["key"]) for e in seen]
check("watch events in order", [k for _, k in kinds] == [b"/gw/w/0", b"/gw/w/1", b"/gw/w/2"])
check("watch_once times out with no event", _times_out(c))
print("etcd3gw: all checks passed")
