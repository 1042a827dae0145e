//! The JSON a client writes by hand (tickets, action bodies), read with an error that
//! names the field it is about: serde_json's own says "invalid type: floating point
//! `1.8446744073709552e19`, expected u64" without saying where.

use serde::de::DeserializeOwned;

/// `text` read as a `T`; the error names the field (`start_step: ...`), quotes at most a
/// short line of the client's input, and says what a whole number may be where one
/// overflowed.
pub(crate) fn from_json<T: DeserializeOwned>(text: &[u8]) -> Result<T, String> {
    let mut de = serde_json::Deserializer::from_slice(text);
    let t = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let inner = e.inner().to_string();
        let hint = match () {
            _ if inner.contains("expected u64") => {
                format!(" (a whole number from 0 to {})", u64::MAX)
            }
            _ if inner.contains("expected u32") => {
                format!(" (a whole number from 0 to {})", u32::MAX)
            }
            _ => String::new(),
        };
        let path = e.path().to_string();
        let named = match path.as_str() {
            "." => inner,
            _ => format!("`{path}`: {inner}"),
        };
        format!("{}{hint}", hydrant_operators::quoted(&named))
    })?;
    de.end()
        .map_err(|e| hydrant_operators::quoted(&e.to_string()))?;
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize, Debug)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct T {
        step: u64,
        rank: u32,
    }

    #[test]
    fn errors_name_the_field_and_the_range() {
        for (text, needles) in [
            (
                r#"{"step": 18446744073709551616, "rank": 0}"#,
                &[
                    "`step`: ",
                    "floating point",
                    "from 0 to 18446744073709551615",
                ][..],
            ),
            (
                r#"{"step": 1, "rank": -1}"#,
                &["`rank`: ", "from 0 to 4294967295"],
            ),
            (r#"{"step": 1, "rank": "0"}"#, &["`rank`: ", "expected u32"]),
            (r#"{"step": 1}"#, &["missing field `rank`"]),
            (r#"{"step": 1, "rank": 0} x"#, &["trailing characters"]),
        ] {
            let err = from_json::<T>(text.as_bytes()).unwrap_err();
            for n in needles {
                assert!(err.contains(n), "{text}: {n} not in {err}");
            }
        }
        assert_eq!(
            from_json::<T>(br#"{"step": 3, "rank": 1}"#).unwrap().step,
            3
        );
    }
}
