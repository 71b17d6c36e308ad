//! What an elicitation form may ask and what an answer to it must hold: the agent's
//! `requestedSchema` (the ACP subset of JSON Schema, read with the schema crate's
//! `ElicitationSchema`) is checked when the request arrives, and a client's `content` is
//! checked against it before it is passed on: only the schema's properties, the required ones
//! present, each of its type and within its bounds (lengths, `pattern`, `format`, `enum`/`oneOf`,
//! `minimum`/`maximum`, multi-select items and counts). Every problem is named, not only the
//! first.

use std::collections::BTreeMap;

use agent_client_protocol_schema::v1::{
    ElicitationContentValue, ElicitationPropertySchema, ElicitationSchema, MultiSelectItems,
    MultiSelectPropertySchema, StringFormat, StringPropertySchema,
};
use regex::Regex;
use serde_json::{Map, Value};

/// Content as the agent receives it.
pub(in crate::gateway) type Content = BTreeMap<String, ElicitationContentValue>;

/// Checks what the content check relies on: every `pattern` compiles, and every required
/// property is defined (else no answer could be valid).
pub(in crate::gateway) fn check_schema(schema: &ElicitationSchema) -> Result<(), String> {
    for (name, property) in &schema.properties {
        if let ElicitationPropertySchema::String(s) = property
            && let Some(pattern) = &s.pattern
        {
            Regex::new(pattern)
                .map_err(|e| format!("property {name:?}: pattern {pattern:?} is invalid: {e}"))?;
        }
    }
    match required(schema).find(|r| !schema.properties.contains_key(*r)) {
        Some(r) => Err(format!("property {r:?} is required but not defined")),
        None => Ok(()),
    }
}

fn required(schema: &ElicitationSchema) -> impl Iterator<Item = &str> {
    schema.required.iter().flatten().map(String::as_str)
}

/// Checks `content` against `schema`; returns it as the agent receives it, or every problem
/// found, joined.
pub(in crate::gateway) fn validate(
    schema: &ElicitationSchema,
    content: &Map<String, Value>,
) -> Result<Content, String> {
    let mut problems = Vec::new();
    for name in required(schema) {
        if !content.contains_key(name) {
            problems.push(format!("{name}: required"));
        }
    }
    for (name, value) in content {
        match schema.properties.get(name) {
            None => problems.push(format!("{name}: not a property of the requested schema")),
            Some(property) => {
                if let Err(why) = check_property(property, value) {
                    problems.push(format!("{name}: {why}"));
                }
            }
        }
    }
    if !problems.is_empty() {
        return Err(problems.join("; "));
    }
    content
        .iter()
        .map(|(name, value)| {
            serde_json::from_value(value.clone())
                .map(|v| (name.clone(), v))
                .map_err(|_| {
                    format!("{name}: must be a string, a number, a boolean or an array of strings")
                })
        })
        .collect()
}

fn check_property(property: &ElicitationPropertySchema, value: &Value) -> Result<(), String> {
    match property {
        ElicitationPropertySchema::String(s) => {
            check_string(s, value.as_str().ok_or("must be a string")?)
        }
        ElicitationPropertySchema::Number(n) => {
            let x = value.as_f64().ok_or("must be a number")?;
            within(x, n.minimum, n.maximum)
        }
        ElicitationPropertySchema::Integer(i) => {
            let x = integer(value).ok_or("must be an integer")?;
            within(x, i.minimum, i.maximum)
        }
        ElicitationPropertySchema::Boolean(_) => match value {
            Value::Bool(_) => Ok(()),
            _ => Err("must be a boolean".into()),
        },
        ElicitationPropertySchema::Array(a) => check_array(a, value),
        // A property type this gateway does not know: passed on as the client wrote it.
        _ => Ok(()),
    }
}

/// An integer, written as one (`3`) or as a number without a fraction (`3.0`).
fn integer(value: &Value) -> Option<i64> {
    let n = value.as_number()?;
    n.as_i64().or_else(|| {
        let x = n.as_f64()?;
        // The bounds are exact powers of two; a float at the upper one does not fit.
        (x.fract() == 0.0 && x >= i64::MIN as f64 && x < i64::MAX as f64).then_some(x as i64)
    })
}

fn within<T: PartialOrd + std::fmt::Display + Copy>(
    x: T,
    min: Option<T>,
    max: Option<T>,
) -> Result<(), String> {
    match (min, max) {
        (Some(min), _) if x < min => Err(format!("must be at least {min}")),
        (_, Some(max)) if x > max => Err(format!("must be at most {max}")),
        _ => Ok(()),
    }
}

fn check_string(s: &StringPropertySchema, text: &str) -> Result<(), String> {
    // JSON Schema counts characters (code points), not bytes.
    let len = text.chars().count();
    if let Some(min) = s.min_length
        && len < min as usize
    {
        return Err(format!("must be at least {min} characters long"));
    }
    if let Some(max) = s.max_length
        && len > max as usize
    {
        return Err(format!("must be at most {max} characters long"));
    }
    if let Some(pattern) = &s.pattern {
        // Known to compile (`check_schema` refused the request otherwise); a search, not a
        // whole-string match, as in JSON Schema.
        let matches = Regex::new(pattern).is_ok_and(|re| re.is_match(text));
        if !matches {
            return Err(format!("must match the pattern {pattern:?}"));
        }
    }
    if let Some(format) = s.format
        && !has_format(format, text)
    {
        return Err(format!("must be {}", format_name(format)));
    }
    if let Some(values) = &s.enum_values
        && !values.iter().any(|v| v == text)
    {
        return Err(format!("must be one of {values:?}"));
    }
    if let Some(options) = &s.one_of
        && !options.iter().any(|o| o.value == text)
    {
        let values: Vec<&str> = options.iter().map(|o| o.value.as_str()).collect();
        return Err(format!("must be one of {values:?}"));
    }
    Ok(())
}

fn check_array(a: &MultiSelectPropertySchema, value: &Value) -> Result<(), String> {
    let items = value.as_array().ok_or("must be an array of strings")?;
    let texts: Vec<&str> = items.iter().filter_map(Value::as_str).collect();
    if texts.len() != items.len() {
        return Err("must be an array of strings".into());
    }
    let count = texts.len() as u64;
    within(count, a.min_items, a.max_items).map_err(|why| format!("{why} items"))?;
    let allowed: Option<Vec<&str>> = match &a.items {
        MultiSelectItems::String(s) => Some(s.values.iter().map(String::as_str).collect()),
        MultiSelectItems::Titled(t) => Some(t.options.iter().map(|o| o.value.as_str()).collect()),
        // Items of a kind this gateway does not know: not checked.
        _ => None,
    };
    if let Some(allowed) = allowed
        && let Some(bad) = texts.iter().find(|t| !allowed.contains(t))
    {
        return Err(format!("{bad:?} is not one of {allowed:?}"));
    }
    Ok(())
}

fn format_name(format: StringFormat) -> &'static str {
    match format {
        StringFormat::Email => "an email address",
        StringFormat::Uri => "a URI",
        StringFormat::Date => "a date (YYYY-MM-DD)",
        StringFormat::DateTime => "a date-time (RFC 3339)",
        _ => "of the requested format",
    }
}

/// A light check of the formats: what a form field should hold, not every corner of the RFCs.
fn has_format(format: StringFormat, text: &str) -> bool {
    match format {
        // One `@` between a non-empty local part and a domain, no whitespace.
        StringFormat::Email => match text.split_once('@') {
            Some((local, domain)) => {
                !local.is_empty()
                    && !domain.is_empty()
                    && !domain.contains('@')
                    && !text.chars().any(char::is_whitespace)
            }
            None => false,
        },
        // A scheme (RFC 3986: a letter, then letters, digits, `+`, `-`, `.`), a colon, and no
        // whitespace.
        StringFormat::Uri => match text.split_once(':') {
            Some((scheme, _)) => {
                let mut chars = scheme.chars();
                chars.next().is_some_and(|c| c.is_ascii_alphabetic())
                    && chars.all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
                    && !text.chars().any(char::is_whitespace)
            }
            None => false,
        },
        StringFormat::Date => {
            text.len() == 10 && chrono::NaiveDate::parse_from_str(text, "%Y-%m-%d").is_ok()
        }
        StringFormat::DateTime => chrono::DateTime::parse_from_rfc3339(text).is_ok(),
        // A format this gateway does not know: not checked.
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> ElicitationSchema {
        serde_json::from_value(json!({
            "type": "object",
            "properties": {
                "name": {"type": "string", "minLength": 2, "maxLength": 5},
                "code": {"type": "string", "pattern": "^[A-Z]{3}$"},
                "email": {"type": "string", "format": "email"},
                "site": {"type": "string", "format": "uri"},
                "day": {"type": "string", "format": "date"},
                "at": {"type": "string", "format": "date-time"},
                "color": {"type": "string", "enum": ["red", "green"]},
                "size": {"type": "string", "oneOf": [{"const": "s", "title": "Small"}, {"const": "l", "title": "Large"}]},
                "age": {"type": "integer", "minimum": 0, "maximum": 150},
                "ratio": {"type": "number", "minimum": 0.5, "maximum": 1.5},
                "ok": {"type": "boolean"},
                "tags": {"type": "array", "minItems": 1, "maxItems": 2, "items": {"type": "string", "enum": ["a", "b", "c"]}},
                "picks": {"type": "array", "items": {"anyOf": [{"const": "x", "title": "X"}]}}
            },
            "required": ["name", "age"]
        }))
        .unwrap()
    }

    fn check(content: Value) -> Result<Content, String> {
        validate(&schema(), content.as_object().unwrap())
    }

    #[test]
    fn valid_content_is_passed_on_typed() {
        let content = check(json!({
            "name": "Ada", "code": "ABC", "email": "ada@example.org", "site": "https://x.org/a",
            "day": "2026-11-25", "at": "2026-11-25T12:00:00Z", "color": "red", "size": "l",
            "age": 36, "ratio": 1, "ok": true, "tags": ["a", "c"], "picks": ["x"]
        }))
        .unwrap();
        assert_eq!(
            content["name"],
            ElicitationContentValue::String("Ada".into())
        );
        assert_eq!(content["age"], ElicitationContentValue::Integer(36));
        assert_eq!(content["ok"], ElicitationContentValue::Boolean(true));
        assert_eq!(
            content["tags"],
            ElicitationContentValue::StringArray(vec!["a".into(), "c".into()])
        );
        assert!(check(json!({"name": "Ada", "age": 36.0})).is_ok());
    }

    #[test]
    fn every_problem_is_named() {
        let err = check(json!({"name": 3, "extra": 1})).unwrap_err();
        assert!(err.contains("age: required"), "{err}");
        assert!(err.contains("name: must be a string"), "{err}");
        assert!(err.contains("extra: not a property"), "{err}");
    }

    #[test]
    fn bounds_patterns_formats_and_choices() {
        let bad = |field: &str, value: Value, expect: &str| {
            let mut content = json!({"name": "Ada", "age": 1});
            content[field] = value;
            let err = check(content).unwrap_err();
            assert!(err.contains(expect), "{field}: {err}");
        };
        bad("name", json!("A"), "at least 2 characters");
        bad("name", json!("Ådäöüx"), "at most 5 characters");
        bad("code", json!("ABCD"), "pattern");
        bad("email", json!("ada.example.org"), "email");
        bad("email", json!("a da@example.org"), "email");
        bad("site", json!("not a uri"), "URI");
        bad("day", json!("2026-13-01"), "date");
        bad("at", json!("2026-11-25 12:00"), "date-time");
        bad("color", json!("blue"), "one of");
        bad("size", json!("m"), "one of");
        bad("age", json!(151), "at most 150");
        bad("age", json!(-1), "at least 0");
        bad("age", json!(1.5), "integer");
        bad("age", json!("1"), "integer");
        bad("ratio", json!(2), "at most 1.5");
        bad("ok", json!("yes"), "boolean");
        bad("tags", json!([]), "at least 1 items");
        bad("tags", json!(["a", "b", "c"]), "at most 2 items");
        bad("tags", json!(["d"]), "not one of");
        bad("tags", json!([1]), "array of strings");
        bad("picks", json!(["y"]), "not one of");
    }

    #[test]
    fn unknown_property_types_pass_but_must_be_plain_values() {
        let schema: ElicitationSchema = serde_json::from_value(json!({
            "properties": {"future": {"type": "_color", "palette": 3}}
        }))
        .unwrap();
        let ok = validate(&schema, json!({"future": "red"}).as_object().unwrap());
        assert!(ok.is_ok());
        let nested = validate(&schema, json!({"future": {"r": 1}}).as_object().unwrap());
        assert!(nested.unwrap_err().contains("must be a string, a number"));
    }

    #[test]
    fn schemas_with_a_bad_pattern_or_an_undefined_required_property_are_refused() {
        assert!(check_schema(&schema()).is_ok());
        let bad_pattern: ElicitationSchema = serde_json::from_value(json!({
            "properties": {"a": {"type": "string", "pattern": "("}}
        }))
        .unwrap();
        assert!(check_schema(&bad_pattern).unwrap_err().contains("pattern"));
        let undefined: ElicitationSchema =
            serde_json::from_value(json!({"properties": {}, "required": ["a"]})).unwrap();
        assert!(
            check_schema(&undefined)
                .unwrap_err()
                .contains("not defined")
        );
    }
}
