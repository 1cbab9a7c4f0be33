//! Request bodies: read with a size limit (413), then decoded per `Content-Encoding` (the SDK
//! sends zstd from 1 KiB up; gzip and deflate for other clients), with the same limit on the
//! decoded size so a small compressed bomb is a 413 too, never an out-of-memory.

use super::error::ApiError;
use axum::body::Body;
use axum::http::{header, HeaderMap};
use futures_util::StreamExt;
use std::io::Read;

/// Reads and decodes a body, refusing anything over `limit` bytes (before or after decoding).
pub async fn read_body(headers: &HeaderMap, body: Body, limit: usize) -> Result<Vec<u8>, ApiError> {
    let too_large = || ApiError::PayloadTooLarge {
        message: format!("the request body is larger than the limit of {limit} bytes"),
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let mut stream = body.into_data_stream();
    if declared.is_some_and(|n| n > limit as u64) {
        drain(&mut stream, limit).await;
        return Err(too_large());
    }
    let mut raw = Vec::with_capacity(declared.map(|n| n as usize).unwrap_or(0));
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| {
            ApiError::unreadable_body(format!("the request body could not be read: {e}"))
        })?;
        if raw.len() + chunk.len() > limit {
            drain(&mut stream, limit).await;
            return Err(too_large());
        }
        raw.extend_from_slice(&chunk);
    }
    decode(headers, raw, limit)
}

/// Reads and discards what is left of a too-large body (up to a bound) before the 413 is sent:
/// a client still writing its body would otherwise see the connection reset instead of the 413.
/// Beyond the bound the connection is simply closed.
async fn drain(stream: &mut axum::body::BodyDataStream, limit: usize) {
    let bound = limit.saturating_mul(4).max(16 * 1024 * 1024);
    let mut seen = 0usize;
    while let Some(Ok(chunk)) = stream.next().await {
        seen += chunk.len();
        if seen > bound {
            break;
        }
    }
}

/// Decodes `raw` per the request's `Content-Encoding`.
pub fn decode(headers: &HeaderMap, raw: Vec<u8>, limit: usize) -> Result<Vec<u8>, ApiError> {
    let encoding = headers
        .get(header::CONTENT_ENCODING)
        .map(|v| v.to_str().unwrap_or("?").trim().to_ascii_lowercase())
        .unwrap_or_default();
    let invalid = |name: &str, e: &dyn std::fmt::Display| {
        ApiError::unreadable_body(format!(
            "the request body is not valid {name} data (Content-Encoding: {name}): {e}"
        ))
    };
    let decoded = match encoding.as_str() {
        "" | "identity" => return Ok(raw),
        "zstd" => {
            // A zstd stream may be several frames back to back (streaming compressors write
            // them): decode until the input is used up, under one size limit.
            let mut source = raw.as_slice();
            let mut out = Vec::new();
            while !source.is_empty() {
                let before = source.len();
                let decoder = ruzstd::decoding::StreamingDecoder::new(&mut source)
                    .map_err(|e| invalid("zstd", &e))?;
                let frame = read_limited(decoder, limit - out.len())
                    .map_err(|e| e.or_invalid(limit, |e| invalid("zstd", &e)))?;
                out.extend_from_slice(&frame);
                if source.len() == before {
                    break;
                }
            }
            out
        }
        "gzip" | "x-gzip" => read_limited(flate2::read::GzDecoder::new(raw.as_slice()), limit)
            .map_err(|e| e.or_invalid(limit, |e| invalid("gzip", &e)))?,
        "deflate" => read_limited(flate2::read::ZlibDecoder::new(raw.as_slice()), limit)
            .map_err(|e| e.or_invalid(limit, |e| invalid("deflate", &e)))?,
        other => {
            return Err(ApiError::UnsupportedMediaType {
                message: format!(
                    "Content-Encoding {other:?} is not supported (use zstd, gzip or none)"
                ),
            })
        }
    };
    Ok(decoded)
}

enum DecodeError {
    TooLarge,
    Invalid(std::io::Error),
}

impl DecodeError {
    fn or_invalid(
        self,
        limit: usize,
        invalid: impl FnOnce(std::io::Error) -> ApiError,
    ) -> ApiError {
        match self {
            DecodeError::TooLarge => ApiError::PayloadTooLarge {
                message: format!(
                    "the decompressed request body is larger than the limit of {limit} bytes"
                ),
            },
            DecodeError::Invalid(e) => invalid(e),
        }
    }
}

fn read_limited(reader: impl Read, limit: usize) -> Result<Vec<u8>, DecodeError> {
    let mut out = Vec::new();
    reader
        .take(limit as u64 + 1)
        .read_to_end(&mut out)
        .map_err(DecodeError::Invalid)?;
    if out.len() > limit {
        return Err(DecodeError::TooLarge);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;
    use std::io::Write;

    fn with_encoding(e: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_ENCODING, HeaderValue::from_str(e).unwrap());
        h
    }

    #[test]
    fn zstd_and_gzip_round_trip() {
        let text = b"{\"model\": \"jev-latest\"}".repeat(100);
        let z = ruzstd::encoding::compress_to_vec(
            text.as_slice(),
            ruzstd::encoding::CompressionLevel::Fastest,
        );
        assert_eq!(
            decode(&with_encoding("zstd"), z, 1 << 20).ok(),
            Some(text.clone())
        );
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&text).unwrap();
        let gz = gz.finish().unwrap();
        assert_eq!(decode(&with_encoding("gzip"), gz, 1 << 20).ok(), Some(text));
    }

    #[test]
    fn concatenated_zstd_frames_are_one_body() {
        let level = ruzstd::encoding::CompressionLevel::Fastest;
        let mut z = ruzstd::encoding::compress_to_vec(&b"{\"model\": "[..], level);
        z.extend(ruzstd::encoding::compress_to_vec(&b"\"m\"}"[..], level));
        assert_eq!(
            decode(&with_encoding("zstd"), z, 1 << 20).ok(),
            Some(b"{\"model\": \"m\"}".to_vec())
        );
    }

    #[test]
    fn bad_data_bombs_and_unknown_encodings_are_4xx() {
        let bad = decode(&with_encoding("zstd"), b"not zstd at all".to_vec(), 1 << 20);
        assert!(matches!(bad, Err(ApiError::BadBody { .. })));
        let bomb = ruzstd::encoding::compress_to_vec(
            vec![b' '; 1 << 20].as_slice(),
            ruzstd::encoding::CompressionLevel::Fastest,
        );
        assert!(matches!(
            decode(&with_encoding("zstd"), bomb, 1000),
            Err(ApiError::PayloadTooLarge { .. })
        ));
        assert!(matches!(
            decode(&with_encoding("br"), vec![1], 10),
            Err(ApiError::UnsupportedMediaType { .. })
        ));
    }
}
