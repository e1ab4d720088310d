# A client of Envoy's rate limit service that the project did not write: Python's grpcio
# (Debian python3-grpcio) and protobuf (python3-protobuf), with the messages of
# envoy.service.ratelimit.v3 and grpc.health.v1 described at run time (field numbers and
# types as in Envoy's and gRPC's .proto files), so no generated stubs are needed.
#
# argv[1]: the service's address (host:port); argv[2]: a JSON list of steps, each one of
#   {"call": {"domain": D, "descriptors": [[[k, v], ...], ...], "hits_addend": N,
#             "descriptor_hits": [N or null, ...]}, "repeat": R}
#   {"health": SERVICE}
#   {"bench": {...call...}, "seconds": S, "threads": T}
#   {"raw": HEX, "pad": N}: these bytes and N more `a` as the request message (hostile
#     input)
#   {"silent": SECONDS}: a call whose request never comes (a client-streaming call whose
#     iterator blocks), waited on for at most SECONDS
#   {"before_boundary": {...call...}, "within": W}: calls until the answer's
#     duration_until_reset says the next whole second is less than W seconds away
#   {"after_boundary": {...call...}}: calls until that time jumps up (a second boundary
#     passed)
#   {"reflect": {"domain": D, "descriptors": ...}}: lists the services by gRPC reflection,
#     fetches the rate limit service's files by reflection (no other protos), builds the
#     request from them and calls ShouldRateLimit with it
# argv[3] (optional): a CA certificate file: the channel is TLS, verified against it
#   (grpc.ssl_channel_credentials), for the name in argv[4] (default localhost).
# Prints one JSON line per step: the last answer of a call, the health status, or the
# bench's calls per second.
import json
import sys
import threading
import time

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

F = descriptor_pb2.FieldDescriptorProto


def message(fdp, name, fields):
    m = fdp.message_type.add(name=name)
    for number, fname, ftype, label, type_name in fields:
        f = m.field.add(name=fname, number=number, type=ftype, label=label)
        if type_name:
            f.type_name = type_name


OPT, REP = F.LABEL_OPTIONAL, F.LABEL_REPEATED
fdp = descriptor_pb2.FileDescriptorProto(name="rls_client.proto", package="t", syntax="proto3")
message(fdp, "Entry", [(1, "key", F.TYPE_STRING, OPT, None), (2, "value", F.TYPE_STRING, OPT, None)])
message(fdp, "UInt64Value", [(1, "value", F.TYPE_UINT64, OPT, None)])
message(fdp, "Descriptor", [
    (1, "entries", F.TYPE_MESSAGE, REP, ".t.Entry"),
    (3, "hits_addend", F.TYPE_MESSAGE, OPT, ".t.UInt64Value"),
])
message(fdp, "Request", [
    (1, "domain", F.TYPE_STRING, OPT, None),
    (2, "descriptors", F.TYPE_MESSAGE, REP, ".t.Descriptor"),
    (3, "hits_addend", F.TYPE_UINT32, OPT, None),
])
message(fdp, "RateLimit", [
    (1, "requests_per_unit", F.TYPE_UINT32, OPT, None),
    (2, "unit", F.TYPE_INT32, OPT, None),
    (3, "name", F.TYPE_STRING, OPT, None),
])
message(fdp, "Duration", [(1, "seconds", F.TYPE_INT64, OPT, None), (2, "nanos", F.TYPE_INT32, OPT, None)])
message(fdp, "Status", [
    (1, "code", F.TYPE_INT32, OPT, None),
    (2, "current_limit", F.TYPE_MESSAGE, OPT, ".t.RateLimit"),
    (3, "limit_remaining", F.TYPE_UINT32, OPT, None),
    (4, "duration_until_reset", F.TYPE_MESSAGE, OPT, ".t.Duration"),
])
message(fdp, "Response", [
    (1, "overall_code", F.TYPE_INT32, OPT, None),
    (2, "statuses", F.TYPE_MESSAGE, REP, ".t.Status"),
])
message(fdp, "HealthCheckRequest", [(1, "service", F.TYPE_STRING, OPT, None)])
message(fdp, "HealthCheckResponse", [(1, "status", F.TYPE_INT32, OPT, None)])
message(fdp, "RefRequest", [
    (1, "host", F.TYPE_STRING, OPT, None),
    (3, "file_by_filename", F.TYPE_STRING, OPT, None),
    (4, "file_containing_symbol", F.TYPE_STRING, OPT, None),
    (7, "list_services", F.TYPE_STRING, OPT, None),
])
message(fdp, "FileDescriptorResponse", [(1, "file_descriptor_proto", F.TYPE_BYTES, REP, None)])
message(fdp, "ServiceResponse", [(1, "name", F.TYPE_STRING, OPT, None)])
message(fdp, "ListServiceResponse", [(1, "service", F.TYPE_MESSAGE, REP, ".t.ServiceResponse")])
message(fdp, "ErrorResponse", [(1, "error_code", F.TYPE_INT32, OPT, None), (2, "error_message", F.TYPE_STRING, OPT, None)])
message(fdp, "RefResponse", [
    (4, "file_descriptor_response", F.TYPE_MESSAGE, OPT, ".t.FileDescriptorResponse"),
    (6, "list_services_response", F.TYPE_MESSAGE, OPT, ".t.ListServiceResponse"),
    (7, "error_response", F.TYPE_MESSAGE, OPT, ".t.ErrorResponse"),
])
M = message_factory.GetMessages([fdp])

CODES = {0: "UNKNOWN", 1: "OK", 2: "OVER_LIMIT"}
HEALTH = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}

if len(sys.argv) > 3:
    with open(sys.argv[3], "rb") as f:
        creds = grpc.ssl_channel_credentials(root_certificates=f.read())
    name = sys.argv[4] if len(sys.argv) > 4 else "localhost"
    channel = grpc.secure_channel(sys.argv[1], creds, options=[("grpc.ssl_target_name_override", name)])
else:
    channel = grpc.insecure_channel(sys.argv[1])
should = channel.unary_unary(
    "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
    request_serializer=lambda m: m.SerializeToString(),
    response_deserializer=M["t.Response"].FromString,
)
check = channel.unary_unary(
    "/grpc.health.v1.Health/Check",
    request_serializer=lambda m: m.SerializeToString(),
    response_deserializer=M["t.HealthCheckResponse"].FromString,
)


def request(spec):
    req = M["t.Request"](domain=spec.get("domain", ""), hits_addend=spec.get("hits_addend", 0))
    per = spec.get("descriptor_hits") or []
    for i, entries in enumerate(spec.get("descriptors", [])):
        d = req.descriptors.add()
        for k, v in entries:
            d.entries.add(key=k, value=v)
        if i < len(per) and per[i] is not None:
            d.hits_addend.value = per[i]
    return req


def answer(resp):
    statuses = []
    for s in resp.statuses:
        st = {"code": CODES.get(s.code, s.code), "remaining": s.limit_remaining}
        if s.HasField("current_limit"):
            st["limit"] = s.current_limit.requests_per_unit
            st["unit"] = s.current_limit.unit
        if s.HasField("duration_until_reset"):
            st["reset"] = s.duration_until_reset.seconds + s.duration_until_reset.nanos / 1e9
        statuses.append(st)
    return {"overall": CODES.get(resp.overall_code, resp.overall_code), "statuses": statuses}


def call(spec, repeat=1):
    req = request(spec)
    out = None
    for _ in range(repeat):
        try:
            out = answer(should(req, timeout=30))
        except grpc.RpcError as e:
            out = {"error": e.code().name, "details": e.details()}
    return out


def to_boundary(spec):
    """One call; the time to the next whole second its first status's reset names."""
    out = call(spec)
    reset = out["statuses"][0]["reset"]
    left = reset - int(reset)
    return out, (left if left > 0 else 1.0)


def before_boundary(spec, within):
    while True:
        out, left = to_boundary(spec)
        if left < within:
            out["to_boundary"] = left
            return out
        time.sleep(min(0.01, left))


def after_boundary(spec):
    _, last = to_boundary(spec)
    while True:
        out, left = to_boundary(spec)
        if left > last:
            out["to_boundary"] = left
            return out
        last = left
        time.sleep(min(0.01, left))


def reflect(spec):
    info = channel.stream_stream(
        "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=M["t.RefResponse"].FromString,
    )

    def ask(**kw):
        return next(info(iter([M["t.RefRequest"](**kw)]), timeout=30))

    services = sorted(s.name for s in ask(list_services="*").list_services_response.service)
    files = {}
    for raw in ask(file_containing_symbol="envoy.service.ratelimit.v3.RateLimitService").file_descriptor_response.file_descriptor_proto:
        f = descriptor_pb2.FileDescriptorProto.FromString(raw)
        files[f.name] = f
    while True:
        missing = [d for f in files.values() for d in f.dependency if d not in files]
        if not missing:
            break
        for raw in ask(file_by_filename=missing[0]).file_descriptor_response.file_descriptor_proto:
            f = descriptor_pb2.FileDescriptorProto.FromString(raw)
            files[f.name] = f
    pool = descriptor_pool.DescriptorPool()
    added = set()
    while len(added) < len(files):
        for name, f in files.items():
            if name not in added and all(d in added for d in f.dependency):
                pool.Add(f)
                added.add(name)
    method = pool.FindServiceByName("envoy.service.ratelimit.v3.RateLimitService").FindMethodByName("ShouldRateLimit")
    def cls(desc):
        new = getattr(message_factory, "GetMessageClass", None)
        return new(desc) if new else message_factory.MessageFactory(pool).GetPrototype(desc)

    Req = cls(method.input_type)
    Resp = cls(method.output_type)
    req = Req(domain=spec["domain"])
    for entries in spec["descriptors"]:
        d = req.descriptors.add()
        for k, v in entries:
            d.entries.add(key=k, value=v)
    call = channel.unary_unary(
        "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=Resp.FromString,
    )
    resp = call(req, timeout=30)
    Code = method.output_type.enum_types_by_name["Code"]
    return {
        "services": services,
        "files": sorted(files),
        "overall": Code.values_by_number[resp.overall_code].name,
        "remaining": [s.limit_remaining for s in resp.statuses],
    }


def bench(spec, seconds, threads):
    req = request(spec)
    should(req, timeout=30)
    count = [0] * threads
    stop = time.monotonic() + seconds

    def run(i):
        while time.monotonic() < stop:
            should(req, timeout=30)
            count[i] += 1

    ts = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    start = time.monotonic()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    took = time.monotonic() - start
    return {"calls": sum(count), "per_second": sum(count) / took}


raw = channel.unary_unary(
    "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
    request_serializer=lambda b: b,
    response_deserializer=lambda b: b,
)
silent = channel.stream_unary(
    "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
    request_serializer=lambda b: b,
    response_deserializer=lambda b: b,
)


def never(wait):
    time.sleep(wait)
    yield b""


for step in json.loads(sys.argv[2]):
    if "call" in step:
        print(json.dumps(call(step["call"], step.get("repeat", 1))), flush=True)
    elif "health" in step:
        try:
            r = check(M["t.HealthCheckRequest"](service=step["health"]), timeout=30)
            print(json.dumps({"status": HEALTH.get(r.status, r.status)}), flush=True)
        except grpc.RpcError as e:
            print(json.dumps({"error": e.code().name}), flush=True)
    elif "raw" in step:
        try:
            raw(bytes.fromhex(step["raw"]) + b"a" * step.get("pad", 0), timeout=30)
            print(json.dumps({"ok": True}), flush=True)
        except grpc.RpcError as e:
            print(json.dumps({"error": e.code().name, "details": e.details()}), flush=True)
    elif "silent" in step:
        started = time.monotonic()
        try:
            silent(never(step["silent"]), timeout=step["silent"])
            print(json.dumps({"ok": True}), flush=True)
        except grpc.RpcError as e:
            took = time.monotonic() - started
            print(json.dumps({"error": e.code().name, "seconds": took}), flush=True)
    elif "before_boundary" in step:
        print(json.dumps(before_boundary(step["before_boundary"], step["within"])), flush=True)
    elif "after_boundary" in step:
        print(json.dumps(after_boundary(step["after_boundary"])), flush=True)
    elif "reflect" in step:
        print(json.dumps(reflect(step["reflect"])), flush=True)
    elif "bench" in step:
        print(json.dumps(bench(step["bench"], step.get("seconds", 5), step.get("threads", 4))), flush=True)
