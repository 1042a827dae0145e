//! A fitted vocabulary's values, in index order, kept in one buffer.

use std::fmt;
use std::sync::Arc;

use serde::de::{DeserializeSeed, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The values of a fitted vocabulary; a value's position is its index.
///
/// All values share one string buffer: a vocabulary of hundreds of thousands of values is
/// two allocations rather than one per value, which is what made loading (and dropping) a
/// fitted state slow. The buffer is shared: a clone (an index bound to the state) costs
/// no copy. It reads and writes as a JSON array of strings.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Vocabulary(Arc<Values>);

#[derive(Clone, Default, PartialEq, Eq)]
struct Values {
    text: String,
    /// Value `i` is `text[ends[i - 1]..ends[i]]` (from 0 for the first).
    ends: Vec<usize>,
}

impl Vocabulary {
    /// An empty vocabulary.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends a value (its index is the length before).
    pub fn push(&mut self, value: &str) {
        let v = Arc::make_mut(&mut self.0);
        v.text.push_str(value);
        v.ends.push(v.text.len());
    }

    /// The number of values.
    pub fn len(&self) -> usize {
        self.0.ends.len()
    }

    /// Whether there are no values.
    pub fn is_empty(&self) -> bool {
        self.0.ends.is_empty()
    }

    /// The value at `index`.
    pub fn get(&self, index: usize) -> Option<&str> {
        let Values { text, ends } = self.0.as_ref();
        let end = *ends.get(index)?;
        let start = if index == 0 { 0 } else { ends[index - 1] };
        Some(&text[start..end])
    }

    /// The values in index order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = &str> + '_ {
        let Values { text, ends } = self.0.as_ref();
        (0..ends.len()).map(move |i| {
            let start = if i == 0 { 0 } else { ends[i - 1] };
            &text[start..ends[i]]
        })
    }
}

impl<S: AsRef<str>> FromIterator<S> for Vocabulary {
    fn from_iter<I: IntoIterator<Item = S>>(values: I) -> Self {
        let mut vocabulary = Vocabulary::new();
        for v in values {
            vocabulary.push(v.as_ref());
        }
        vocabulary
    }
}

impl fmt::Debug for Vocabulary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl Serialize for Vocabulary {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.iter())
    }
}

impl<'de> Deserialize<'de> for Vocabulary {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Values;
        impl<'de> Visitor<'de> for Values {
            type Value = Vocabulary;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an array of strings")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vocabulary, A::Error> {
                let mut vocabulary = Vocabulary::new();
                while seq.next_element_seed(Append(&mut vocabulary))?.is_some() {}
                Ok(vocabulary)
            }
        }
        deserializer.deserialize_seq(Values)
    }
}

/// Reads one string straight into the vocabulary's buffer (no `String` per value).
struct Append<'a>(&'a mut Vocabulary);

impl<'de> DeserializeSeed<'de> for Append<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl Visitor<'_> for Append<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a string")
    }
    fn visit_str<E: serde::de::Error>(self, value: &str) -> Result<(), E> {
        self.0.push(value);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_values_in_order_and_reads_back_as_json() {
        let v: Vocabulary = ["b", "", "a\"é", "b"].into_iter().collect();
        assert_eq!(v.len(), 4);
        assert_eq!(v.iter().collect::<Vec<_>>(), ["b", "", "a\"é", "b"]);
        assert_eq!(
            (v.get(1), v.get(2), v.get(4)),
            (Some(""), Some("a\"é"), None)
        );
        let json = serde_json::to_string(&v).unwrap();
        assert_eq!(json, r#"["b","","a\"é","b"]"#);
        assert_eq!(serde_json::from_str::<Vocabulary>(&json).unwrap(), v);
        assert!(serde_json::from_str::<Vocabulary>(r#"["a", 1]"#).is_err());
        assert!(serde_json::from_str::<Vocabulary>("[]").unwrap().is_empty());
    }
}
