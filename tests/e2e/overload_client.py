"""python3-grpcio's part of e2e.overload_clients (test_overload_clients.py): an open-loop load of
BatchVerify calls on a server's gRPC port, --rate calls per second for --seconds over --channels
connections, each call with a deadline of --deadline_ms, whatever the answers. Every answer is
checked (--items results, all invalid: the request's signatures are over other messages); every
RESOURCE_EXHAUSTED refusal's retry delay is read from its grpc-status-details-bin trailer, a
google.rpc.Status parsed with the code harness.py generates from proto/google/rpc, whose
RetryInfo detail is unpacked.

    /usr/bin/python3 overload_client.py --address=127.0.0.1:50051 --request_file=req.bin \\
        --items=32 --rate=100 --seconds=10 --deadline_ms=2000 --channels=2

Prints one JSON line, as the other clients of the test do: {"client", "sent", "codes", "wrong",
"retry": {"with", "without", "min_ms", "max_ms"}, "messages"}.
"""

import argparse
import json
import sys
import time

import grpc

import harness
from harness import pb, retry_delay_ms


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--address", required=True)
    parser.add_argument("--request_file", required=True)
    parser.add_argument("--items", type=int, required=True)
    parser.add_argument("--rate", type=float, required=True)
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--deadline_ms", type=int, default=2000)
    parser.add_argument("--channels", type=int, default=2)
    args = parser.parse_args()
    with open(args.request_file, "rb") as f:
        request = pb.ed.BatchVerifyRequest.FromString(f.read())
    # A connection of its own each (no shared subchannel pool), as separate client processes.
    channels = [grpc.insecure_channel(args.address, options=[
        ("grpc.use_local_subchannel_pool", 1), ("grpc.enable_retries", 0),
        ("grpc.enable_http_proxy", 0)]) for _ in range(args.channels)]
    stubs = [pb.ed_grpc.Ed25519ServiceStub(c) for c in channels]
    futures = []
    total = int(args.rate * args.seconds)
    start = time.monotonic()
    for i in range(total):
        due = start + i / args.rate
        now = time.monotonic()
        if due > now:
            time.sleep(due - now)
        futures.append(stubs[i % len(stubs)].BatchVerify.future(
            request, timeout=args.deadline_ms / 1000.0))
    out = {"client": "python3-grpcio", "sent": total, "codes": {}, "wrong": 0,
           "retry": {"with": 0, "without": 0, "min_ms": None, "max_ms": None}, "messages": []}
    for f in futures:
        error = f.exception()
        if error is None:
            name = "OK"
            results = f.result().results
            if len(results) != args.items or any(r.valid or r.status.code for r in results):
                out["wrong"] += 1
        else:
            name = error.code().name
            if name not in ("RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED"):
                message = "%s: %s" % (name, error.details())
                if len(out["messages"]) < 10 and message not in out["messages"]:
                    out["messages"].append(message)
            if name == "RESOURCE_EXHAUSTED":
                ms = retry_delay_ms(error)
                retry = out["retry"]
                if ms is None:
                    retry["without"] += 1
                else:
                    retry["with"] += 1
                    retry["min_ms"] = ms if retry["min_ms"] is None else min(retry["min_ms"], ms)
                    retry["max_ms"] = ms if retry["max_ms"] is None else max(retry["max_ms"], ms)
        out["codes"][name] = out["codes"].get(name, 0) + 1
    for c in channels:
        c.close()
    sys.stdout.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
