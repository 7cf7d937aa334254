//! Reading the server's YAML documents: flat mappings (`stats`,
//! `stats-tube`) and lists (`list-tubes`), the only two shapes it prints.
//!
//! Not a YAML parser: the server writes one `key: value` or `- item` per
//! line with nothing nested, and a real parser would misread some values
//! (the `os` field may start with `#`, which YAML takes for a comment).

use serde_json::{Map, Number, Value};

/// The `key: value` pairs of a mapping document, in the server's order.
pub fn pairs(doc: &str) -> Vec<(&str, &str)> {
    doc.lines()
        .filter_map(|line| {
            line.split_once(": ")
                .or_else(|| line.strip_suffix(':').map(|key| (key, "")))
        })
        .collect()
}

/// The value of `key` in a mapping document, as a number.
pub fn number(doc: &str, key: &str) -> Option<u64> {
    pairs(doc)
        .into_iter()
        .find(|(k, _)| *k == key)
        .and_then(|(_, v)| v.parse().ok())
}

/// The items of a list document.
pub fn items(doc: &str) -> Vec<&str> {
    doc.lines()
        .filter_map(|line| line.strip_prefix("- "))
        .collect()
}

/// A mapping document as a JSON object, keys in the server's order.
///
/// Numbers become JSON numbers, `true` and `false` booleans, a quoted
/// string its contents; the values of `text_keys` always stay strings,
/// since their text only sometimes looks like a number (a server's hex
/// `id`, a tube named `2024`), and a field's type should not depend on
/// its value.
pub fn to_json(doc: &str, text_keys: &[&str]) -> Value {
    let object: Map<String, Value> = pairs(doc)
        .into_iter()
        .map(|(key, raw)| {
            let value = if text_keys.contains(&key) {
                Value::String(unquote(raw))
            } else {
                scalar(raw)
            };
            (key.to_string(), value)
        })
        .collect();
    Value::Object(object)
}

/// One value as the JSON it stands for.
fn scalar(raw: &str) -> Value {
    match raw {
        "true" => return Value::Bool(true),
        "false" => return Value::Bool(false),
        _ => {}
    }
    // JSON's number grammar refuses leading zeros, so `0123` stays text.
    match raw.parse::<Number>() {
        Ok(n) => Value::Number(n),
        Err(_) => Value::String(unquote(raw)),
    }
}

/// A double-quoted value's contents; any other value as it is. The server
/// quotes only names and versions, which have no escapes, but JSON's
/// string grammar covers YAML's double-quoted one for those.
fn unquote(raw: &str) -> String {
    if raw.len() >= 2
        && raw.starts_with('"')
        && raw.ends_with('"')
        && let Ok(text) = serde_json::from_str::<String>(raw)
    {
        return text;
    }
    raw.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mappings_become_objects_with_their_types() {
        let doc = "---\ncurrent-jobs-ready: 3\nrusage-utime: 0.012000\n\
                   version: \"0.1.0\"\ndraining: false\nid: 0123456789012345\n\
                   os: #1 SMP PREEMPT_DYNAMIC\nhostname: 4711\n";
        let json = to_json(doc, &["id", "hostname"]);
        assert_eq!(
            json.to_string(),
            r##"{"current-jobs-ready":3,"rusage-utime":0.012,"version":"0.1.0","draining":false,"id":"0123456789012345","os":"#1 SMP PREEMPT_DYNAMIC","hostname":"4711"}"##
        );
        assert_eq!(number(doc, "current-jobs-ready"), Some(3));
        assert_eq!(number(doc, "version"), None);
        assert_eq!(number(doc, "absent"), None);
    }

    #[test]
    fn lists_are_their_items() {
        assert_eq!(items("---\n- default\n- 2024\n"), ["default", "2024"]);
        assert!(items("---\n").is_empty());
    }
}
