//! The span model every exporter reads: OpenTelemetry's fields, nothing engine-specific.
use serde::Serialize;

/// An attribute value (the OpenTelemetry attribute types the spec uses).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum AttrValue {
    Str(String),
    Int(i64),
    Float(f64),
    Bool(bool),
    StrArray(Vec<String>),
    IntArray(Vec<i64>),
    FloatArray(Vec<f64>),
}

impl From<&str> for AttrValue {
    fn from(v: &str) -> Self {
        Self::Str(v.to_owned())
    }
}
impl From<String> for AttrValue {
    fn from(v: String) -> Self {
        Self::Str(v)
    }
}
impl From<i64> for AttrValue {
    fn from(v: i64) -> Self {
        Self::Int(v)
    }
}
impl From<u64> for AttrValue {
    /// Saturates: counts and nanosecond durations never come near i64::MAX.
    fn from(v: u64) -> Self {
        Self::Int(i64::try_from(v).unwrap_or(i64::MAX))
    }
}
impl From<f64> for AttrValue {
    fn from(v: f64) -> Self {
        Self::Float(v)
    }
}
impl From<bool> for AttrValue {
    fn from(v: bool) -> Self {
        Self::Bool(v)
    }
}

pub type Attributes = Vec<(&'static str, AttrValue)>;

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SpanEvent {
    pub name: &'static str,
    pub time_unix_nano: u64,
    #[serde(serialize_with = "attributes_as_map")]
    pub attributes: Attributes,
}

/// One finished span. Ids are raw bytes; exporters format them.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Span {
    #[serde(serialize_with = "hex")]
    pub trace_id: [u8; 16],
    #[serde(serialize_with = "hex")]
    pub span_id: [u8; 8],
    #[serde(serialize_with = "hex_opt")]
    pub parent_span_id: Option<[u8; 8]>,
    pub name: String,
    pub start_time_unix_nano: u64,
    pub end_time_unix_nano: u64,
    #[serde(serialize_with = "attributes_as_map")]
    pub attributes: Attributes,
    pub events: Vec<SpanEvent>,
    /// Links to other spans of the same trace (their span ids), not parents: SGLang links each
    /// stage to the one before it.
    #[serde(serialize_with = "hex_list", skip_serializing_if = "Vec::is_empty")]
    pub links: Vec<[u8; 8]>,
    /// Error status with its message; None is status UNSET.
    pub error: Option<String>,
}

impl Span {
    pub fn attribute(&self, key: &str) -> Option<&AttrValue> {
        self.attributes
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v)
    }
}

/// W3C trace context of a parent: `00-<trace id>-<span id>-<flags>`.
pub fn parse_traceparent(header: &str) -> Option<([u8; 16], [u8; 8])> {
    let mut parts = header.trim().split('-');
    let (version, trace, span, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    if version.len() != 2 || version == "ff" || flags.len() != 2 {
        return None;
    }
    let trace: [u8; 16] = unhex(trace)?;
    let span: [u8; 8] = unhex(span)?;
    if trace == [0; 16] || span == [0; 8] {
        return None;
    }
    Some((trace, span))
}

fn unhex<const N: usize>(s: &str) -> Option<[u8; N]> {
    if s.len() != 2 * N {
        return None;
    }
    let mut out = [0; N];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// Lower-case hex of an id.
pub fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Random ids (never all-zero, which OpenTelemetry reserves for "invalid").
#[derive(Debug)]
pub struct IdGenerator(fastrand::Rng);

impl Default for IdGenerator {
    fn default() -> Self {
        Self(fastrand::Rng::new())
    }
}

impl IdGenerator {
    pub fn trace_id(&mut self) -> [u8; 16] {
        loop {
            let id = self.0.u128(..).to_be_bytes();
            if id != [0; 16] {
                return id;
            }
        }
    }

    pub fn span_id(&mut self) -> [u8; 8] {
        loop {
            let id = self.0.u64(..).to_be_bytes();
            if id != [0; 8] {
                return id;
            }
        }
    }
}

fn hex<S: serde::Serializer, const N: usize>(id: &[u8; N], s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&to_hex(id))
}

fn hex_opt<S: serde::Serializer>(id: &Option<[u8; 8]>, s: S) -> Result<S::Ok, S::Error> {
    match id {
        Some(id) => s.serialize_str(&to_hex(id)),
        None => s.serialize_none(),
    }
}

fn hex_list<S: serde::Serializer>(ids: &[[u8; 8]], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(ids.iter().map(|id| to_hex(id)))
}

fn attributes_as_map<S: serde::Serializer>(attrs: &Attributes, s: S) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeMap;
    let mut map = s.serialize_map(Some(attrs.len()))?;
    for (k, v) in attrs {
        map.serialize_entry(k, v)?;
    }
    map.end()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent() {
        let (trace, span) =
            parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
        assert_eq!(to_hex(&trace), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(to_hex(&span), "00f067aa0ba902b7");
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473x-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902-01",
        ] {
            assert_eq!(parse_traceparent(bad), None, "{bad}");
        }
    }
}
