//! One canonical JSON encoding (RFC 8785, JCS) over a deliberately small value model.
//!
//! **Owns:** strict parsing of received bytes and canonical encoding.
//!
//! **Never:** accepts duplicate keys, non-integer numbers, or integers outside the
//! IEEE-754 safe range (±(2^53 − 1)) — JCS would have to round those, so they are refused
//! rather than silently changed; accepts bytes that are not already canonical.
//!
//! Parsing reuses serde_json's tokenizer through a strict `Visitor`; canonicality is then
//! checked by re-encoding and comparing bytes, which rejects whitespace, other key orders,
//! unnecessary escapes (`\u0041`), alternative number forms (`1.0`, `1e0`, `-0`) and
//! everything else that is not the one encoding.

use std::fmt;

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};

/// Largest integer JSON carries without rounding in an IEEE-754 double.
pub const MAX_SAFE_INT: i64 = (1 << 53) - 1;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    Null,
    Bool(bool),
    Int(i64),
    Str(String),
    Array(Vec<Value>),
    /// Insertion order as received; the encoder sorts.
    Object(Vec<(String, Value)>),
}

impl Value {
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Value::Int(i) => Some(*i),
            _ => None,
        }
    }
    pub fn get(&self, key: &str) -> Option<&Value> {
        match self {
            Value::Object(m) => m.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CanonicalError {
    #[error("not valid JSON: {0}")]
    Syntax(String),
    #[error("duplicate key {0:?}")]
    DuplicateKey(String),
    #[error("numbers must be integers")]
    NonInteger,
    #[error("integer outside the safe range ±(2^53-1)")]
    UnsafeInteger,
    #[error("bytes are not in canonical form")]
    NotCanonical,
}

struct StrictVisitor;

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = Value;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_bool<E: de::Error>(self, b: bool) -> Result<Value, E> {
        Ok(Value::Bool(b))
    }
    fn visit_i64<E: de::Error>(self, i: i64) -> Result<Value, E> {
        if (-MAX_SAFE_INT..=MAX_SAFE_INT).contains(&i) {
            Ok(Value::Int(i))
        } else {
            Err(E::custom(CanonicalError::UnsafeInteger))
        }
    }
    fn visit_u64<E: de::Error>(self, u: u64) -> Result<Value, E> {
        if u <= MAX_SAFE_INT as u64 {
            Ok(Value::Int(u as i64))
        } else {
            Err(E::custom(CanonicalError::UnsafeInteger))
        }
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Value, E> {
        Err(E::custom(CanonicalError::NonInteger))
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<Value, E> {
        Ok(Value::Str(s.to_string()))
    }
    fn visit_string<E: de::Error>(self, s: String) -> Result<Value, E> {
        Ok(Value::Str(s))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut v = Vec::new();
        while let Some(x) = seq.next_element_seed(Strict)? {
            v.push(x);
        }
        Ok(Value::Array(v))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out: Vec<(String, Value)> = Vec::new();
        while let Some(k) = map.next_key::<String>()? {
            if out.iter().any(|(x, _)| *x == k) {
                return Err(de::Error::custom(CanonicalError::DuplicateKey(k)));
            }
            let v = map.next_value_seed(Strict)?;
            out.push((k, v));
        }
        Ok(Value::Object(out))
    }
}

struct Strict;

impl<'de> de::DeserializeSeed<'de> for Strict {
    type Value = Value;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(StrictVisitor)
    }
}

/// Parses `bytes` strictly (no duplicate keys, integers only, safe range).
pub fn parse(bytes: &[u8]) -> Result<Value, CanonicalError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let v = de::DeserializeSeed::deserialize(Strict, &mut de).map_err(classify)?;
    de.end().map_err(classify)?;
    Ok(v)
}

fn classify(e: serde_json::Error) -> CanonicalError {
    let msg = e.to_string();
    for specific in [CanonicalError::NonInteger, CanonicalError::UnsafeInteger] {
        if msg.starts_with(&specific.to_string()) {
            return specific;
        }
    }
    if let Some(rest) = msg.strip_prefix("duplicate key ") {
        let key = rest
            .split(" at line")
            .next()
            .unwrap_or(rest)
            .trim_matches('"');
        return CanonicalError::DuplicateKey(key.to_string());
    }
    CanonicalError::Syntax(msg)
}

/// Parses and insists the bytes are exactly the canonical encoding of what they parse to.
pub fn parse_canonical(bytes: &[u8]) -> Result<Value, CanonicalError> {
    let v = parse(bytes)?;
    if encode(&v) != bytes {
        return Err(CanonicalError::NotCanonical);
    }
    Ok(v)
}

/// The RFC 8785 encoding of `v`.
pub fn encode(v: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    write(v, &mut out);
    out
}

fn write(v: &Value, out: &mut Vec<u8>) {
    match v {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        Value::Int(i) => out.extend_from_slice(i.to_string().as_bytes()),
        Value::Str(s) => write_str(s, out),
        Value::Array(a) => {
            out.push(b'[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write(x, out);
            }
            out.push(b']');
        }
        Value::Object(m) => {
            // JCS orders members by the UTF-16 code units of their names.
            let mut members: Vec<&(String, Value)> = m.iter().collect();
            members.sort_by(|a, b| a.0.encode_utf16().cmp(b.0.encode_utf16()));
            out.push(b'{');
            for (i, (k, x)) in members.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_str(k, out);
                out.push(b':');
                write(x, out);
            }
            out.push(b'}');
        }
    }
}

fn write_str(s: &str, out: &mut Vec<u8>) {
    out.push(b'"');
    for c in s.chars() {
        match c {
            '"' => out.extend_from_slice(b"\\\""),
            '\\' => out.extend_from_slice(b"\\\\"),
            '\u{8}' => out.extend_from_slice(b"\\b"),
            '\u{c}' => out.extend_from_slice(b"\\f"),
            '\n' => out.extend_from_slice(b"\\n"),
            '\r' => out.extend_from_slice(b"\\r"),
            '\t' => out.extend_from_slice(b"\\t"),
            c if (c as u32) < 0x20 => {
                out.extend_from_slice(format!("\\u{:04x}", c as u32).as_bytes())
            }
            c => {
                let mut b = [0u8; 4];
                out.extend_from_slice(c.encode_utf8(&mut b).as_bytes());
            }
        }
    }
    out.push(b'"');
}

/// Converts a `serde_json` value (for example a serialized receipt) into the canonical
/// model, refusing what the model refuses (non-integers, unsafe integers).
pub fn from_json(v: &serde_json::Value) -> Result<Value, CanonicalError> {
    Ok(match v {
        serde_json::Value::Null => Value::Null,
        serde_json::Value::Bool(b) => Value::Bool(*b),
        serde_json::Value::Number(n) => match n.as_i64() {
            Some(i) if (-MAX_SAFE_INT..=MAX_SAFE_INT).contains(&i) => Value::Int(i),
            Some(_) => return Err(CanonicalError::UnsafeInteger),
            None if n.as_u64().is_some() => return Err(CanonicalError::UnsafeInteger),
            None => return Err(CanonicalError::NonInteger),
        },
        serde_json::Value::String(s) => Value::Str(s.clone()),
        serde_json::Value::Array(a) => {
            Value::Array(a.iter().map(from_json).collect::<Result<_, _>>()?)
        }
        serde_json::Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, v)| Ok((k.clone(), from_json(v)?)))
                .collect::<Result<_, CanonicalError>>()?,
        ),
    })
}

/// The reverse of [`from_json`].
pub fn to_json(v: &Value) -> serde_json::Value {
    match v {
        Value::Null => serde_json::Value::Null,
        Value::Bool(b) => serde_json::Value::Bool(*b),
        Value::Int(i) => serde_json::Value::from(*i),
        Value::Str(s) => serde_json::Value::String(s.clone()),
        Value::Array(a) => serde_json::Value::Array(a.iter().map(to_json).collect()),
        Value::Object(m) => {
            serde_json::Value::Object(m.iter().map(|(k, v)| (k.clone(), to_json(v))).collect())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc8785_examples() {
        let v =
            parse(br#"{"b":2,"a":[true,null,"x\u0041\n"],"\u20ac":1,"\ud83d\ude00":0,"\ufb33":3}"#)
                .unwrap();
        // UTF-16 order: U+20AC < U+D83D (surrogate of U+1F600) < U+FB33.
        assert_eq!(
            String::from_utf8(encode(&v)).unwrap(),
            "{\"a\":[true,null,\"xA\\n\"],\"b\":2,\"\u{20ac}\":1,\"\u{1f600}\":0,\"\u{fb33}\":3}"
        );
    }

    #[test]
    fn strictness() {
        assert_eq!(
            parse(br#"{"a":1,"a":2}"#),
            Err(CanonicalError::DuplicateKey("a".into()))
        );
        assert_eq!(parse(b"1.0"), Err(CanonicalError::NonInteger));
        assert_eq!(parse(b"1e3"), Err(CanonicalError::NonInteger));
        assert_eq!(
            parse(b"9007199254740992"),
            Err(CanonicalError::UnsafeInteger)
        );
        assert_eq!(
            parse(b"-9007199254740992"),
            Err(CanonicalError::UnsafeInteger)
        );
        assert_eq!(parse(b"9007199254740991"), Ok(Value::Int(MAX_SAFE_INT)));
        assert!(matches!(parse(b"{} x"), Err(CanonicalError::Syntax(_))));
        for non_canonical in [
            &b"{ }"[..],
            b"{\"b\":1,\"a\":2}",
            b"\"\\u0041\"",
            b"-0",
            b"[1, 2]",
            b"\"\\/\"",
        ] {
            assert!(
                parse_canonical(non_canonical).is_err(),
                "{}",
                String::from_utf8_lossy(non_canonical)
            );
        }
        assert!(parse_canonical(b"{\"a\":2,\"b\":1}").is_ok());
        assert!(parse_canonical(b"\"\\u001f\"").is_ok());
        assert!(parse_canonical(b"\"\\u001F\"").is_err());
    }
}
