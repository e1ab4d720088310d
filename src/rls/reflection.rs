//! gRPC server reflection (`grpc.reflection.v1`, tonic-reflection) for the rate limit
//! service, so that a generic client (grpcurl, Postman, grpcio's reflection) calls
//! `ShouldRateLimit` without Envoy's protos.
//!
//! `envoy-types` ships Envoy's generated types but not their descriptors, so the files
//! served here are built in code: the messages of `envoy/service/ratelimit/v3/rls.proto`
//! and `envoy/extensions/common/ratelimit/v3/ratelimit.proto` with their real names,
//! packages and field numbers, restricted to the fields tollgate reads or answers
//! (`domain`, `descriptors` with `entries` and `hits_addend`, the request's
//! `hits_addend`; `overall_code`, `statuses` with `code`, `current_limit`,
//! `limit_remaining`, `duration_until_reset`), and the two well-known types they use. A
//! client built from them speaks the same wire format as one built from Envoy's files;
//! fields left out (headers, quota, dynamic metadata, a descriptor's `limit` override)
//! are ones tollgate never sets or ignores.

use prost_types::field_descriptor_proto::{Label, Type};
use prost_types::{
    DescriptorProto, EnumDescriptorProto, EnumValueDescriptorProto, FieldDescriptorProto,
    FileDescriptorProto, FileDescriptorSet, MethodDescriptorProto, ServiceDescriptorProto,
};

/// The service's full name, as reflection lists it.
pub const SERVICE: &str = "envoy.service.ratelimit.v3.RateLimitService";

fn field(name: &str, number: i32, ty: Type, type_name: Option<&str>) -> FieldDescriptorProto {
    FieldDescriptorProto {
        name: Some(name.to_string()),
        number: Some(number),
        label: Some(Label::Optional as i32),
        r#type: Some(ty as i32),
        type_name: type_name.map(str::to_string),
        json_name: Some(json_name(name)),
        ..FieldDescriptorProto::default()
    }
}

fn repeated(name: &str, number: i32, ty: Type, type_name: Option<&str>) -> FieldDescriptorProto {
    FieldDescriptorProto {
        label: Some(Label::Repeated as i32),
        ..field(name, number, ty, type_name)
    }
}

/// protoc's JSON name: lower camel case.
fn json_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut upper = false;
    for c in name.chars() {
        if c == '_' {
            upper = true;
        } else if upper {
            out.push(c.to_ascii_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

fn message(name: &str, fields: Vec<FieldDescriptorProto>) -> DescriptorProto {
    DescriptorProto {
        name: Some(name.to_string()),
        field: fields,
        ..DescriptorProto::default()
    }
}

fn enumeration(name: &str, values: &[&str]) -> EnumDescriptorProto {
    EnumDescriptorProto {
        name: Some(name.to_string()),
        value: values
            .iter()
            .zip(0..)
            .map(|(v, n)| EnumValueDescriptorProto {
                name: Some((*v).to_string()),
                number: Some(n),
                ..EnumValueDescriptorProto::default()
            })
            .collect(),
        ..EnumDescriptorProto::default()
    }
}

fn file(
    name: &str,
    package: &str,
    deps: &[&str],
    messages: Vec<DescriptorProto>,
) -> FileDescriptorProto {
    FileDescriptorProto {
        name: Some(name.to_string()),
        package: Some(package.to_string()),
        dependency: deps.iter().map(|d| (*d).to_string()).collect(),
        message_type: messages,
        syntax: Some("proto3".to_string()),
        ..FileDescriptorProto::default()
    }
}

/// The files reflection serves (module doc).
pub fn descriptors() -> FileDescriptorSet {
    let duration = file(
        "google/protobuf/duration.proto",
        "google.protobuf",
        &[],
        vec![message(
            "Duration",
            vec![
                field("seconds", 1, Type::Int64, None),
                field("nanos", 2, Type::Int32, None),
            ],
        )],
    );
    let wrappers = file(
        "google/protobuf/wrappers.proto",
        "google.protobuf",
        &[],
        vec![message(
            "UInt64Value",
            vec![field("value", 1, Type::Uint64, None)],
        )],
    );
    let mut descriptor = message(
        "RateLimitDescriptor",
        vec![
            repeated(
                "entries",
                1,
                Type::Message,
                Some(".envoy.extensions.common.ratelimit.v3.RateLimitDescriptor.Entry"),
            ),
            field(
                "hits_addend",
                3,
                Type::Message,
                Some(".google.protobuf.UInt64Value"),
            ),
        ],
    );
    descriptor.nested_type.push(message(
        "Entry",
        vec![
            field("key", 1, Type::String, None),
            field("value", 2, Type::String, None),
        ],
    ));
    let common = file(
        "envoy/extensions/common/ratelimit/v3/ratelimit.proto",
        "envoy.extensions.common.ratelimit.v3",
        &["google/protobuf/wrappers.proto"],
        vec![descriptor],
    );
    let request = message(
        "RateLimitRequest",
        vec![
            field("domain", 1, Type::String, None),
            repeated(
                "descriptors",
                2,
                Type::Message,
                Some(".envoy.extensions.common.ratelimit.v3.RateLimitDescriptor"),
            ),
            field("hits_addend", 3, Type::Uint32, None),
        ],
    );
    const RESPONSE: &str = ".envoy.service.ratelimit.v3.RateLimitResponse";
    let code = format!("{RESPONSE}.Code");
    let mut limit = message(
        "RateLimit",
        vec![
            field("requests_per_unit", 1, Type::Uint32, None),
            field(
                "unit",
                2,
                Type::Enum,
                Some(&format!("{RESPONSE}.RateLimit.Unit")),
            ),
            field("name", 3, Type::String, None),
        ],
    );
    limit.enum_type.push(enumeration(
        "Unit",
        &[
            "UNKNOWN", "SECOND", "MINUTE", "HOUR", "DAY", "MONTH", "YEAR", "WEEK",
        ],
    ));
    let status = message(
        "DescriptorStatus",
        vec![
            field("code", 1, Type::Enum, Some(&code)),
            field(
                "current_limit",
                2,
                Type::Message,
                Some(&format!("{RESPONSE}.RateLimit")),
            ),
            field("limit_remaining", 3, Type::Uint32, None),
            field(
                "duration_until_reset",
                4,
                Type::Message,
                Some(".google.protobuf.Duration"),
            ),
        ],
    );
    let mut response = message(
        "RateLimitResponse",
        vec![
            field("overall_code", 1, Type::Enum, Some(&code)),
            repeated(
                "statuses",
                2,
                Type::Message,
                Some(&format!("{RESPONSE}.DescriptorStatus")),
            ),
        ],
    );
    response
        .enum_type
        .push(enumeration("Code", &["UNKNOWN", "OK", "OVER_LIMIT"]));
    response.nested_type.extend([limit, status]);
    let mut rls = file(
        "envoy/service/ratelimit/v3/rls.proto",
        "envoy.service.ratelimit.v3",
        &[
            "envoy/extensions/common/ratelimit/v3/ratelimit.proto",
            "google/protobuf/duration.proto",
        ],
        vec![request, response],
    );
    rls.service.push(ServiceDescriptorProto {
        name: Some("RateLimitService".to_string()),
        method: vec![MethodDescriptorProto {
            name: Some("ShouldRateLimit".to_string()),
            input_type: Some(".envoy.service.ratelimit.v3.RateLimitRequest".to_string()),
            output_type: Some(RESPONSE.to_string()),
            ..MethodDescriptorProto::default()
        }],
        ..ServiceDescriptorProto::default()
    });
    FileDescriptorSet {
        file: vec![duration, wrappers, common, rls],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_service_and_its_types_are_described() {
        let set = descriptors();
        let rls = set.file.last().unwrap();
        assert_eq!(rls.package(), "envoy.service.ratelimit.v3");
        let svc = &rls.service[0];
        assert_eq!(format!("{}.{}", rls.package(), svc.name()), SERVICE);
        assert_eq!(svc.method[0].name(), "ShouldRateLimit");
        assert_eq!(json_name("duration_until_reset"), "durationUntilReset");
        // Every dependency is served too.
        let names: Vec<&str> = set.file.iter().map(|f| f.name()).collect();
        for f in &set.file {
            for d in &f.dependency {
                assert!(names.contains(&d.as_str()), "{d}");
            }
        }
    }
}
