//! The Flight ticket: UTF-8 JSON that any client can write by hand (DESIGN.md, "Flight
//! ticket"); bad tickets are rejected with a message naming the field.

use serde::{Deserialize, Serialize};

/// What a DoGet asks for: one rank's stream of one epoch of one pipeline.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ticket {
    /// The served pipeline's name.
    pub pipeline: String,
    /// The epoch, from 0.
    #[serde(default)]
    pub epoch: u64,
    /// This trainer's rank, below `world_size`.
    pub rank: u32,
    /// Ranks in the data-parallel job.
    pub world_size: u32,
    /// The first step to deliver (to resume after the last finished one).
    #[serde(default)]
    pub start_step: u64,
    /// The job the trainer read before (the `job` of its batches' metadata), 16 hex
    /// digits: a server that serves another job refuses the ticket. Left out, any.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "hex")]
    pub job: Option<u64>,
}

/// An optional `u64` as a string of 16 hex digits (JSON numbers past 2^53 are not read
/// exactly everywhere).
pub(crate) mod hex {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(job: &Option<u64>, s: S) -> Result<S::Ok, S::Error> {
        match job {
            Some(j) => s.serialize_str(&format!("{j:016x}")),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
        let text = Option::<String>::deserialize(d)?;
        text.map(|t| {
            let whole = t.len() == 16 && t.bytes().all(|b| b.is_ascii_hexdigit());
            whole
                .then(|| u64::from_str_radix(&t, 16).ok())
                .flatten()
                .ok_or_else(|| serde::de::Error::custom("expected 16 hex digits"))
        })
        .transpose()
    }
}

/// Why a ticket was rejected; its message names the field.
#[derive(Debug, thiserror::Error)]
#[error("invalid ticket: {0}")]
pub struct TicketError(String);

impl Ticket {
    /// Parses and checks a ticket.
    pub fn parse(bytes: &[u8]) -> Result<Ticket, TicketError> {
        let text = std::str::from_utf8(bytes).map_err(|_| TicketError("not UTF-8".into()))?;
        // serde would also take the fields as an array, in order: a ticket names them.
        if !text.trim_start().starts_with('{') {
            return Err(TicketError(
                "not a JSON object (`{\"pipeline\": ..., \"rank\": ..., ...}`)".into(),
            ));
        }
        let t: Ticket = crate::json::from_json(text.as_bytes()).map_err(TicketError)?;
        if t.world_size == 0 {
            return Err(TicketError("`world_size` must be at least 1".into()));
        }
        if t.rank >= t.world_size {
            return Err(TicketError(format!(
                "`rank` {} is not below `world_size` {}",
                t.rank, t.world_size
            )));
        }
        Ok(t)
    }

    /// The ticket as bytes, as a client sends it.
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let t = Ticket {
            pipeline: "p".into(),
            epoch: 3,
            rank: 0,
            world_size: 1,
            start_step: 9,
            job: None,
        };
        assert_eq!(Ticket::parse(&t.to_bytes()).unwrap(), t);
        let with_job = Ticket {
            job: Some(0xab),
            ..t
        };
        let bytes = with_job.to_bytes();
        assert!(String::from_utf8_lossy(&bytes).contains(r#""job":"00000000000000ab""#));
        assert_eq!(Ticket::parse(&bytes).unwrap(), with_job);
        let upper = br#"{"pipeline":"p","rank":0,"world_size":1,"job":"00000000000000AB"}"#;
        assert_eq!(Ticket::parse(upper).unwrap().job, Some(0xab));
    }

    #[test]
    fn rejects_naming_the_field() {
        for (bytes, needle) in [
            (&b"\xff"[..], "UTF-8"),
            (b"not json", "JSON object"),
            (br#"{"pipeline":"p" "#, "EOF"),
            (br#"["p",0,1,2,3]"#, "JSON object"),
            (
                br#"{"pipeline":"p","rank":0,"world_size":1,"colour":1}"#,
                "colour",
            ),
            (br#"{"pipeline":"p","rank":0}"#, "world_size"),
            (br#"{"pipeline":"p","rank":-1,"world_size":1}"#, "`rank`: "),
            (
                br#"{"pipeline":"p","rank":0,"world_size":1,"start_step":18446744073709551616}"#,
                "`start_step`: ",
            ),
            (br#"{"pipeline":"p","rank":0,"world_size":0}"#, "world_size"),
            (br#"{"pipeline":"p","rank":3,"world_size":2}"#, "rank"),
            (
                br#"{"pipeline":"p","rank":0,"world_size":1,"job":"12ab"}"#,
                "`job`: expected 16 hex digits",
            ),
            (
                br#"{"pipeline":"p","rank":0,"world_size":1,"job":"+0000000000000ff"}"#,
                "`job`: expected 16 hex digits",
            ),
            (
                br#"{"pipeline":"p","rank":0,"world_size":1,"job":255}"#,
                "`job`: ",
            ),
        ] {
            let err = Ticket::parse(bytes).unwrap_err().to_string();
            assert!(err.contains(needle), "{needle}: {err}");
        }
    }

    #[test]
    fn errors_quote_a_client_briefly_and_on_one_line() {
        // Found by fuzzing: an unknown field's name was repeated whole, newlines included.
        let field = format!("a\\nb{}", "x".repeat(10_000));
        let bytes = format!(r#"{{"{field}":1}}"#);
        let err = Ticket::parse(bytes.as_bytes()).unwrap_err().to_string();
        assert!(!err.contains('\n') && err.contains("a\\nb"), "{err}");
        assert!(err.chars().count() < 260, "{}", err.len());
    }
}
