#!/usr/bin/python3
# Client for test-faults.sh: batches of small random writes, zeroes and
# trims from several connections, interleaved with reads, extents and
# cache requests, each batch ended by a flush, against a plugin that
# fails requests at random (the error filter).  Every request must
# either succeed or fail cleanly:
#   - a read that succeeds returns what the model holds for every byte
#     whose write was acknowledged, flushed or not (a deferred
#     write-back failure must not make acknowledged data unreadable);
#   - the client does what a real one does: a failed write, zero or
#     trim is sent again until it succeeds, and when a flush fails the
#     whole batch is written again and flushed, until a flush succeeds.
# At the end the model is written to MODEL for the caller to compare
# with the backing file: a write whose flush succeeded is never lost.
import argparse, random, sys
import nbd

p = argparse.ArgumentParser()
p.add_argument("seed", type=int)
p.add_argument("uri")
p.add_argument("size", type=int)
p.add_argument("model")
p.add_argument("--batches", type=int, default=25)
p.add_argument("--conns", type=int, default=2)
a = p.parse_args()
rng = random.Random(a.seed)

hs = []
for _ in range(a.conns):
    h = nbd.NBD()
    h.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
    h.connect_uri(a.uri)
    hs.append(h)
model = bytearray(a.size)          # committed: flushed successfully
known = bytearray(b"\1" * a.size)   # 0: trimmed, contents undefined
errors = ok = checked = 0


def attempt(fn, *args):
    """One request; True when it succeeded, False on a clean error."""
    global errors, ok
    try:
        r = fn(*args)
        ok += 1
        return True if r is None else r
    except nbd.Error as e:
        if e.errno is None:
            sys.exit("fault-client: seed %d: not an errno error: %s"
                     % (a.seed, e.string))
        errors += 1
        return False


cursor = {}


def read_check(h, cur, curknown):
    """Half the reads are a 4K stream per connection (readahead)."""
    global checked
    if rng.random() < 0.5:
        n = 4096
        off = cursor.get(h, rng.randrange(0, a.size // 4096) * 4096)
        if off + n > a.size:
            off = 0
        cursor[h] = off + n
    else:
        n = rng.choice([1, 512, 4096, 5000, 65536, 200000])
        off = rng.randrange(0, a.size - n + 1)
    got = attempt(h.pread, n, off)
    if got is False:
        return
    for i in range(n):
        b = off + i
        if curknown[b] and got[i] != cur[b]:
            sys.exit("fault-client: seed %d: WRONG DATA at %d: got %d want %d"
                     % (a.seed, b, got[i], cur[b]))
    checked += n


def make_batch():
    ops = []
    for _ in range(rng.randrange(4, 24)):
        n = rng.choice([1, 100, 4096, 4097, 16384, rng.randrange(1, 70000)])
        off = rng.randrange(0, a.size - n + 1)
        kind = rng.choices(["write", "zero", "trim"], [8, 1, 1])[0]
        data = rng.randbytes(n) if kind == "write" else bytes(n)
        ops.append((kind, off, n, data))
    return ops


def apply(h, op, new, newknown):
    """One write, zero or trim, retried until it succeeds."""
    kind, off, n, data = op
    for _ in range(100):
        if kind == "write":
            r = attempt(h.pwrite, data, off)
        elif kind == "zero":
            r = attempt(h.zero, n, off)
        else:
            r = attempt(h.trim, n, off)
        if r:
            break
    else:
        sys.exit("fault-client: seed %d: %s %d+%d failed 100 times"
                 % (a.seed, kind, off, n))
    new[off:off + n] = data
    newknown[off:off + n] = (b"\0" if kind == "trim" else b"\1") * n


for b in range(a.batches):
    ops = make_batch()
    new = bytearray(model)
    newknown = bytearray(known)
    for attempt_no in range(100):
        for op in ops:
            h = rng.choice(hs)
            apply(h, op, new, newknown)
            r = rng.random()
            if r < 0.3:
                for _ in range(8):
                    read_check(rng.choice(hs), new, newknown)
            elif r < 0.4:
                attempt(h.block_status, 65536, rng.randrange(0, a.size - 65536),
                        lambda *args: 0)
            elif r < 0.5:
                attempt(h.cache, 65536, rng.randrange(0, a.size - 65536))
        # One flush covers every connection's writes (multi-conn).
        if attempt(rng.choice(hs).flush):
            break
    else:
        sys.exit("fault-client: seed %d: no flush succeeded in 100 tries"
                 % a.seed)
    model[:] = new
    known[:] = newknown
    for _ in range(4):
        read_check(rng.choice(hs), model, known)

for h in hs:
    h.shutdown()
open(a.model, "wb").write(model)
open(a.model + ".mask", "wb").write(known)
print("fault-client: seed %d: %d ok, %d errors, %d bytes checked"
      % (a.seed, ok, errors, checked))
