//! The protobuf JSON mapping as etcd 3.4's gateway speaks it, for any message of
//! the compiled schema: JSON in, protobuf bytes out, and back.
//!
//! etcd marshals with grpc-gateway's `JSONPb{OrigName: true}` over golang's
//! jsonpb: field names as written in the .proto (`create_revision`, `ID`,
//! `grantedTTL`), 64-bit integers as strings, enums by name, fields at their
//! default left out; on input both names of a field, strings or numbers for
//! integers, enum names or numbers (an unknown enum name is refused), and
//! unknown fields are ignored. The same options of prost-reflect's serde
//! mapping give the same text.

use std::sync::OnceLock;

use bytes::Bytes;
use prost::Message;
use prost_reflect::SerializeOptions;
use prost_reflect::{DescriptorPool, DeserializeOptions, DynamicMessage, Kind, MessageDescriptor};

/// The schema Cairn was compiled from, decoded once.
pub fn pool() -> &'static DescriptorPool {
    static POOL: OnceLock<DescriptorPool> = OnceLock::new();
    POOL.get_or_init(|| {
        DescriptorPool::decode(cairn_proto::FILE_DESCRIPTOR_SET)
            .expect("the descriptor set compiled into cairn-proto decodes")
    })
}

const SERIALIZE: SerializeOptions = SerializeOptions::new()
    .use_proto_field_name(true)
    .stringify_64_bit_integers(true)
    .use_enum_numbers(false)
    .skip_default_fields(true);

/// Unknown fields are dropped before a parse that may meet them (see
/// [`drop_unknown_fields`]), so this parse refuses only what etcd refuses,
/// such as an unknown enum name, which a lenient parse would skip silently.
const STRICT: DeserializeOptions = DeserializeOptions::new().deny_unknown_fields(true);

/// Removes the members of JSON objects that name no field of their message,
/// at every depth, as etcd's parser ignores them.
fn drop_unknown_fields(desc: &MessageDescriptor, value: &mut serde_json::Value) {
    let serde_json::Value::Object(map) = value else {
        return;
    };
    let field = |name: &str| {
        desc.get_field_by_name(name)
            .or_else(|| desc.get_field_by_json_name(name))
    };
    map.retain(|name, _| field(name).is_some());
    for (name, v) in map.iter_mut() {
        let Some(Kind::Message(inner)) = field(name).map(|f| f.kind()) else {
            continue;
        };
        match v {
            serde_json::Value::Array(items) => items
                .iter_mut()
                .for_each(|i| drop_unknown_fields(&inner, i)),
            v => drop_unknown_fields(&inner, v),
        }
    }
}

/// Why a request body is not a message of the expected type.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct JsonError(String);

impl JsonError {
    pub fn new(why: String) -> JsonError {
        JsonError(why)
    }
}

/// Reads the first JSON value of `body` as a `desc` message and encodes it.
/// An empty body or `null` is the empty message; anything after the first
/// value is ignored (as etcd's gateway, which decodes one value and stops).
pub fn request_from_json(desc: &MessageDescriptor, body: &[u8]) -> Result<Bytes, JsonError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Bytes::new());
    }
    // The common case, straight from the text into the message; text with
    // unknown fields, `null`, or bad text goes the longer way, which says why.
    let mut de = serde_json::Deserializer::from_slice(body);
    if let Ok(message) = DynamicMessage::deserialize_with_options(desc.clone(), &mut de, &STRICT) {
        return Ok(Bytes::from(message.encode_to_vec()));
    }
    let mut values = serde_json::Deserializer::from_slice(body).into_iter::<serde_json::Value>();
    match values.next() {
        Some(Ok(value)) => message_from_value(desc, value),
        Some(Err(e)) => Err(JsonError(e.to_string())),
        None => Ok(Bytes::new()),
    }
}

/// Encodes one already parsed JSON value as a `desc` message.
pub fn message_from_value(
    desc: &MessageDescriptor,
    mut value: serde_json::Value,
) -> Result<Bytes, JsonError> {
    if value.is_null() {
        return Ok(Bytes::new());
    }
    drop_unknown_fields(desc, &mut value);
    let message = DynamicMessage::deserialize_with_options(desc.clone(), value, &STRICT)
        .map_err(|e| JsonError(e.to_string()))?;
    Ok(Bytes::from(message.encode_to_vec()))
}

/// Writes an encoded `desc` message as JSON, appending to `out`.
pub fn response_to_json(
    desc: &MessageDescriptor,
    encoded: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), JsonError> {
    let message = DynamicMessage::decode(desc.clone(), encoded)
        .map_err(|e| JsonError(format!("decoding a {}: {e}", desc.full_name())))?;
    let mut serializer = serde_json::Serializer::new(out);
    message
        .serialize_with_options(&mut serializer, &SERIALIZE)
        .map_err(|e| JsonError(e.to_string()))
}
