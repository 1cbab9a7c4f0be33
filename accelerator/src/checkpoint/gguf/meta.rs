//! GGUF metadata values and the typed views of them the model and tokenizer loaders read.

/// One metadata value, in the type the file stores it as.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Vec<MetaValue>),
}

impl MetaValue {
    /// GGUF's name of the value's type, for messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            MetaValue::U8(_) => "uint8",
            MetaValue::I8(_) => "int8",
            MetaValue::U16(_) => "uint16",
            MetaValue::I16(_) => "int16",
            MetaValue::U32(_) => "uint32",
            MetaValue::I32(_) => "int32",
            MetaValue::U64(_) => "uint64",
            MetaValue::I64(_) => "int64",
            MetaValue::F32(_) => "float32",
            MetaValue::F64(_) => "float64",
            MetaValue::Bool(_) => "bool",
            MetaValue::String(_) => "string",
            MetaValue::Array(_) => "array",
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// Any integer type holding a non-negative value (converters write counts as u32, i32 or
    /// u64 depending on their version).
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            MetaValue::U8(v) => Some(v.into()),
            MetaValue::U16(v) => Some(v.into()),
            MetaValue::U32(v) => Some(v.into()),
            MetaValue::U64(v) => Some(v),
            MetaValue::I8(v) => u64::try_from(v).ok(),
            MetaValue::I16(v) => u64::try_from(v).ok(),
            MetaValue::I32(v) => u64::try_from(v).ok(),
            MetaValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// Any integer type, signed.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            MetaValue::I8(v) => Some(v.into()),
            MetaValue::I16(v) => Some(v.into()),
            MetaValue::I32(v) => Some(v.into()),
            MetaValue::I64(v) => Some(v),
            MetaValue::U8(v) => Some(v.into()),
            MetaValue::U16(v) => Some(v.into()),
            MetaValue::U32(v) => Some(v.into()),
            MetaValue::U64(v) => i64::try_from(v).ok(),
            _ => None,
        }
    }

    /// A float, or an integer read as one (a converter may write `1e-6` or `10000` either way).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetaValue::F32(v) => Some(v.into()),
            MetaValue::F64(v) => Some(v),
            _ => self.as_i64().map(|v| v as f64),
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            MetaValue::Bool(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[MetaValue]> {
        match self {
            MetaValue::Array(items) => Some(items),
            _ => None,
        }
    }
}

/// Why an array key could not be read as the list a caller asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum ListError {
    Missing,
    NotArray(&'static str),
    /// Element `index` is of type `found` (or out of range for the list's type).
    Element {
        index: usize,
        found: &'static str,
    },
}

/// The elements of `value` converted by `each`, which answers `None` for an element it cannot
/// take.
pub(super) fn list<'a, T>(
    value: Option<&'a MetaValue>,
    each: impl Fn(&'a MetaValue) -> Option<T>,
) -> Result<Vec<T>, ListError> {
    let value = value.ok_or(ListError::Missing)?;
    let items = value
        .as_array()
        .ok_or(ListError::NotArray(value.type_name()))?;
    items
        .iter()
        .enumerate()
        .map(|(index, item)| {
            each(item).ok_or(ListError::Element {
                index,
                found: item.type_name(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_convert_across_types_and_refuse_negatives() {
        assert_eq!(MetaValue::I32(7).as_u64(), Some(7));
        assert_eq!(MetaValue::I32(-7).as_u64(), None);
        assert_eq!(MetaValue::U64(u64::MAX).as_i64(), None);
        assert_eq!(MetaValue::U32(10000).as_f64(), Some(10000.0));
        assert_eq!(MetaValue::F32(0.5).as_f64(), Some(0.5));
        assert_eq!(MetaValue::F32(0.5).as_u64(), None);
        assert_eq!(MetaValue::String("x".into()).as_bool(), None);
    }

    #[test]
    fn lists_name_the_first_element_that_does_not_fit() {
        let v = MetaValue::Array(vec![MetaValue::I32(1), MetaValue::String("a".into())]);
        assert_eq!(
            list(Some(&v), MetaValue::as_i64),
            Err(ListError::Element {
                index: 1,
                found: "string"
            })
        );
        assert_eq!(
            list(Some(&MetaValue::U8(1)), MetaValue::as_i64),
            Err(ListError::NotArray("uint8"))
        );
        assert_eq!(list(None, MetaValue::as_i64), Err(ListError::Missing));
    }
}
