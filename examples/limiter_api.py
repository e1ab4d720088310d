#!/usr/bin/env python3
"""A limiter API client in Python, with redis-py and nothing else.

Against a tollgate whose config has `server.limiter_api: "127.0.0.1:9049"` and

    resources:
      sends: { kind: rate, max: 5, per: 1h }
      uploads: { kind: concurrency, max: 3 }

run `python3 examples/limiter_api.py 9049`. Replies of the CH.* commands are maps
(field, value, field, value... in RESP2, which redis-py 4 speaks): `fields` makes them a dict.
"""

import sys

import redis


def fields(reply):
    """A CH.* reply (a flat list of field, value, ...) as a dict."""
    return dict(zip(reply[::2], reply[1::2]))


def main(port):
    r = redis.Redis(host="127.0.0.1", port=port, decode_responses=True)

    # Smyte: two logins a minute per user. The reply is what the bucket held before the
    # take; the take happened iff it is at least 1.
    for _ in range(3):
        before = r.execute_command("RL.REDUCE", "logins:alice", 2, 60)
        print("login", "allowed" if before >= 1 else "refused", before)

    # Charon: send up to 4 messages now, at least 2 (or none).
    sent = fields(r.execute_command("CH.REQUEST", "sends", "alice", 4, "MIN", 2))
    print("sends granted", sent["granted"], "remaining", sent["remaining"])
    again = fields(r.execute_command("CH.REQUEST", "sends", "alice", 4, "MIN", 2))
    print("sends granted", again["granted"], "retry after ms", again["retry_after_ms"])

    # Charon: hold 2 upload slots while uploading, then give them back. Had this process
    # died instead, closing its connection would have released them.
    held = fields(r.execute_command("CH.RESERVE", "uploads", "acme", 2))
    print("uploads held", held["granted"], "groups", held["groups"])
    freed = fields(r.execute_command("CH.RELEASE", "uploads", "acme", held["granted"]))
    print("uploads released", freed["released"], "still held", freed["held"])
    try:
        r.execute_command("CH.RELEASE", "uploads", "acme", 1)
    except redis.ResponseError as e:
        print("over-release refused:", e)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 9049)
