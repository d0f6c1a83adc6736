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
/// [`normalize`]), so this parse refuses only what etcd refuses,
/// such as an unknown enum name, which a lenient parse would skip silently.
const STRICT: DeserializeOptions = DeserializeOptions::new().deny_unknown_fields(true);

/// Makes a parsed value read as etcd's parser reads it, at every depth:
/// members of JSON objects that name no field of their message are removed
/// (etcd ignores them), and so are the line breaks in the base64 text of
/// bytes fields (Go's decoder skips `\r` and `\n`, so text from `base64`
/// without `-w0`, broken every 76 characters, is accepted).
fn normalize(desc: &MessageDescriptor, value: &mut serde_json::Value) {
    let serde_json::Value::Object(map) = value else {
        return;
    };
    let field = |name: &str| {
        desc.get_field_by_name(name)
            .or_else(|| desc.get_field_by_json_name(name))
    };
    map.retain(|name, _| field(name).is_some());
    for (name, v) in map.iter_mut() {
        match field(name).map(|f| f.kind()) {
            Some(Kind::Message(inner)) => match v {
                serde_json::Value::Array(items) => {
                    items.iter_mut().for_each(|i| normalize(&inner, i))
                }
                v => normalize(&inner, v),
            },
            Some(Kind::Bytes) => match v {
                serde_json::Value::Array(items) => items.iter_mut().for_each(drop_line_breaks),
                v => drop_line_breaks(v),
            },
            _ => {}
        }
    }
}

/// Removes `\r` and `\n` from a JSON string.
fn drop_line_breaks(v: &mut serde_json::Value) {
    if let serde_json::Value::String(text) = v {
        if text.contains(['\r', '\n']) {
            text.retain(|c| c != '\r' && c != '\n');
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
    // unknown fields, `null`, line breaks in base64, or bad text goes the
    // longer way, which says why.
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
    normalize(desc, &mut value);
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

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_proto::etcdserverpb::{PutRequest, RequestOp, TxnRequest};

    fn parse<M: Message + Default>(name: &str, body: &str) -> Result<M, JsonError> {
        let desc = pool()
            .get_message_by_name(name)
            .expect("a message of the schema");
        let bytes = request_from_json(&desc, body.as_bytes())?;
        Ok(M::decode(bytes).expect("the encoded message decodes"))
    }

    #[test]
    fn line_breaks_in_base64_are_skipped_as_gos_decoder_skips_them() {
        // "a value long enough to wrap" in base64, broken every 16
        // characters.
        let put: PutRequest = parse(
            "etcdserverpb.PutRequest",
            r#"{"key":"Zm9v\n","value":"YSB2YWx1ZSBsb25n\r\nIGVub3VnaCB0byB3\ncmFw\n","unknown":1}"#,
        )
        .expect("parsed");
        assert_eq!(&put.key[..], b"foo");
        assert_eq!(&put.value[..], b"a value long enough to wrap");
        // Inside a txn's ops too.
        let txn: TxnRequest = parse(
            "etcdserverpb.TxnRequest",
            r#"{"success":[{"request_put":{"key":"Zm9v\n"}}]}"#,
        )
        .expect("parsed");
        let RequestOp { request } = &txn.success[0];
        match request {
            Some(cairn_proto::etcdserverpb::request_op::Request::RequestPut(p)) => {
                assert_eq!(&p.key[..], b"foo")
            }
            other => panic!("{other:?}"),
        }
        // Text that is not base64 is still refused.
        assert!(parse::<PutRequest>("etcdserverpb.PutRequest", r#"{"key":"Zm9v!"}"#).is_err());
    }
}
