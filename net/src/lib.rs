//! Cairn's peer transport: framed TCP connections between members, without copying payloads.
