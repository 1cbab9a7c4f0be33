//! Whole files through the reader: a round trip of what the test writer wrote, loads through
//! MLX, and the errors a damaged or unsupported file gives.

use half::f16;
use mlx_rs::{ops, Dtype};

use super::writer::Writer;
use super::*;

fn s(x: &str) -> MetaValue {
    MetaValue::String(x.to_owned())
}

/// One of every metadata type, and three tensors: F32 `[2, 3]`, Q8_0 `[2, 32]`, F16 `[4]`.
fn sample() -> Writer {
    let q8: Vec<u8> = (0..2)
        .flat_map(|b: u8| {
            let d = f16::from_f32(0.5 + b as f32).to_bits().to_le_bytes();
            let qs = (0..32u8).map(move |j| j.wrapping_mul(9).wrapping_add(b));
            d.into_iter().chain(qs)
        })
        .collect();
    let f32s: Vec<u8> = (0..6)
        .flat_map(|i| (i as f32 * 0.25).to_le_bytes())
        .collect();
    let f16s: Vec<u8> = [1.0f32, -2.0, 0.5, 3.0]
        .iter()
        .flat_map(|&x| f16::from_f32(x).to_bits().to_le_bytes())
        .collect();
    Writer::new()
        .meta("general.architecture", s("llama"))
        .meta("u8", MetaValue::U8(200))
        .meta("i8", MetaValue::I8(-5))
        .meta("u16", MetaValue::U16(60000))
        .meta("i16", MetaValue::I16(-30000))
        .meta("u32", MetaValue::U32(4_000_000_000))
        .meta("i32", MetaValue::I32(-7))
        .meta("u64", MetaValue::U64(1 << 40))
        .meta("i64", MetaValue::I64(-(1 << 40)))
        .meta("f32", MetaValue::F32(1e-6))
        .meta("f64", MetaValue::F64(10000.5))
        .meta("bool", MetaValue::Bool(true))
        .meta("tokens", MetaValue::Array(vec![s("<s>"), s("é"), s("")]))
        .meta(
            "types",
            MetaValue::Array(vec![MetaValue::I32(1), MetaValue::I32(3)]),
        )
        .meta("scores", MetaValue::Array(vec![MetaValue::F32(-1.5)]))
        .meta(
            "nested",
            MetaValue::Array(vec![MetaValue::Array(vec![MetaValue::U8(1)])]),
        )
        .tensor("a.weight", &[3, 2], 0, f32s)
        .tensor("q.weight", &[32, 2], 8, q8)
        .tensor("n.weight", &[4], 1, f16s)
}

fn open(w: &Writer) -> (tempfile::TempDir, Result<GgufFile, GgufError>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = w.write(dir.path(), "m.gguf");
    let file = GgufFile::open(&path);
    (dir, file)
}

fn error_of(bytes: &[u8]) -> String {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("bad.gguf");
    std::fs::write(&path, bytes).expect("write");
    match GgufFile::open(&path) {
        Ok(_) => panic!("a damaged file opened"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn metadata_and_tensor_infos_round_trip() {
    let w = sample();
    let (_dir, file) = open(&w);
    let file = file.expect("opens");
    assert!(GgufFile::is_gguf(file.path()));
    assert_eq!(file.version(), 3);
    assert_eq!(file.architecture(), Some("llama"));
    for (key, value) in &w.metadata {
        assert_eq!(file.get(key), Some(value), "{key}");
    }
    assert_eq!(file.metadata().len(), w.metadata.len());
    assert_eq!(file.uint("u32"), Some(4_000_000_000));
    assert_eq!(file.uint("i32"), None);
    assert_eq!(file.float("f32"), Some(1e-6f32 as f64));
    assert_eq!(file.float("u8"), Some(200.0));
    assert_eq!(file.boolean("bool"), Some(true));
    assert_eq!(file.string("u8"), None);
    assert_eq!(file.strings("tokens").expect("strings"), ["<s>", "é", ""]);
    assert_eq!(file.i32s("types").expect("i32s"), [1, 3]);
    assert_eq!(file.f32s("scores").expect("f32s"), [-1.5]);
    let wrong = file.i32s("tokens").expect_err("strings are not i32s");
    assert!(
        wrong
            .to_string()
            .contains("metadata tokens: element 0 is a string"),
        "{wrong}"
    );
    assert!(file.strings("absent").is_err());

    let names: Vec<&str> = file.tensors().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["a.weight", "q.weight", "n.weight"]);
    let q = file.tensor("q.weight").expect("q");
    assert_eq!(
        (q.ggml_type, q.dims.as_slice()),
        (GgmlType::Q8_0, &[32u64, 2][..])
    );
    assert_eq!(q.shape(), [2, 32]);
    assert_eq!(q.offset, 32);
    assert_eq!(file.resident_bytes(q, FloatDtype::F16), 64 + 2 * 2 * 2);
    let a = file.tensor("a.weight").expect("a");
    assert_eq!(file.resident_bytes(a, FloatDtype::F16), 24);
}

#[test]
fn tensors_load_row_major_through_mlx() {
    let (_dir, file) = open(&sample());
    let file = file.expect("opens");
    let GgufWeight::Dense(a) = file.load("a.weight", FloatDtype::F16).expect("a") else {
        panic!("F32 loads dense");
    };
    assert_eq!((a.shape(), a.dtype()), (&[2, 3][..], Dtype::Float32));
    assert_eq!(a.as_slice::<f32>(), [0.0, 0.25, 0.5, 0.75, 1.0, 1.25]);
    let GgufWeight::Dense(n) = file.load("n.weight", FloatDtype::F32).expect("n") else {
        panic!("F16 loads dense");
    };
    assert_eq!(n.dtype(), Dtype::Float16);
    let n: Vec<f32> = n.as_slice::<f16>().iter().map(|x| x.to_f32()).collect();
    assert_eq!(n, [1.0, -2.0, 0.5, 3.0]);

    let GgufWeight::Affine {
        weight,
        scales,
        biases,
        bits,
        group_size,
    } = file.load("q.weight", FloatDtype::F32).expect("q")
    else {
        panic!("Q8_0 loads affine");
    };
    assert_eq!((bits, group_size), (8, 32));
    assert_eq!((weight.shape(), scales.shape()), (&[2, 8][..], &[2, 1][..]));
    let w = ops::dequantize(&weight, &scales, &biases, group_size, bits).expect("dequantize");
    let w = w.as_slice::<f32>();
    for b in 0..2u8 {
        for j in 0..32u8 {
            let q = j.wrapping_mul(9).wrapping_add(b) as i8;
            let want = (0.5 + b as f32) * q as f32;
            assert_eq!(w[b as usize * 32 + j as usize], want, "row {b} element {j}");
        }
    }
    let missing = file
        .load("nope", FloatDtype::F32)
        .expect_err("no such tensor");
    assert!(
        missing.to_string().ends_with("no tensor named nope"),
        "{missing}"
    );
}

#[test]
fn unsupported_types_are_named_when_loaded() {
    // IQ4_NL (20) has a known size, so the file opens and lists it; an unknown id (77) too.
    let w = Writer::new()
        .tensor("iq.weight", &[32], 20, vec![0; 18])
        .tensor("odd.weight", &[32], 77, vec![0; 18]);
    let (_dir, file) = open(&w);
    let file = file.expect("opens");
    for (name, ty) in [("iq.weight", "IQ4_NL"), ("odd.weight", "type 77")] {
        let e = file
            .load(name, FloatDtype::F32)
            .expect_err("refused")
            .to_string();
        assert!(
            e.contains(&format!("tensor {name} is stored as {ty}")),
            "{e}"
        );
        assert!(e.starts_with(&file.path().display().to_string()), "{e}");
    }
}

#[test]
fn damaged_headers_are_errors_naming_what_is_wrong() {
    let good = sample().bytes();
    let mut magic = good.clone();
    magic[..4].copy_from_slice(b"GGUX");
    let e = error_of(&magic);
    assert!(
        e.contains("not the magic \"GGUF\"") && e.contains("bad.gguf"),
        "{e}"
    );

    let mut v1 = good.clone();
    v1[4..8].copy_from_slice(&1u32.to_le_bytes());
    assert!(error_of(&v1).contains("GGUF version 1; only versions 2 and 3"));
    let mut big = good.clone();
    big[4..8].copy_from_slice(&3u32.to_be_bytes());
    assert!(error_of(&big).contains("big-endian"));

    // Cut anywhere in the header, the file is refused as truncated (the data section is three
    // tensors padded to 32, 96 and 32 bytes).
    let header_end = good.len() - 160;
    for cut in [0, 3, 7, 20, 40, header_end / 2, header_end - 1] {
        let e = error_of(&good[..cut]);
        assert!(e.contains("truncated"), "cut at {cut}: {e}");
    }
    // Cut in the data section: the tensor past the end is named.
    let e = error_of(&good[..good.len() - 30]);
    assert!(
        e.contains("tensor n.weight (F16, at data offset") && e.contains("truncated"),
        "{e}"
    );

    let w = Writer::new().meta("k", MetaValue::U8(1));
    let mut unknown = w.bytes();
    // The value type follows the 8-byte length and the key "k".
    let at = 4 + 4 + 8 + 8 + 8 + 1;
    unknown[at..at + 4].copy_from_slice(&13u32.to_le_bytes());
    let e = error_of(&unknown);
    assert!(
        e.contains("the value of k has unknown value type 13"),
        "{e}"
    );

    let huge = Writer::new().meta("k", MetaValue::Array(vec![MetaValue::U8(1)]));
    let mut huge = huge.bytes();
    let count_at = 4 + 4 + 8 + 8 + 8 + 1 + 4 + 4;
    huge[count_at..count_at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(error_of(&huge).contains("array of 18446744073709551615 elements"));

    let ragged = Writer::new().tensor("r.weight", &[48, 2], 2, vec![0; 18 * 3]);
    let e = error_of(&ragged.bytes());
    assert!(
        e.contains("tensor r.weight (Q4_0") && e.contains("row length 48"),
        "{e}"
    );

    let five = Writer::new().tensor("t", &[1, 1, 1, 1, 1], 0, vec![0; 4]);
    assert!(error_of(&five.bytes()).contains("5 dimensions"));
}

#[test]
fn is_gguf_reads_only_the_magic() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("x");
    std::fs::write(&path, b"GGUF").expect("write");
    assert!(GgufFile::is_gguf(&path));
    std::fs::write(&path, b"{\"a\"").expect("write");
    assert!(!GgufFile::is_gguf(&path));
    assert!(!GgufFile::is_gguf(&dir.path().join("absent")));
}

/// A Q4_K `[2, 256]` matrix's bytes (two super-blocks of 144 bytes).
fn q4_k_bytes() -> Vec<u8> {
    (0..2 * 144).map(|i| (i * 37 % 251) as u8).collect()
}

#[test]
fn broken_files_are_refused_naming_the_tensor_and_the_cause() {
    // A tensor given fewer bytes than its type and shape need: they run into the next one's
    // (the file long enough that they do not run past its end).
    let short = Writer::new()
        .tensor("short.weight", &[256, 2], 12, vec![0; 144])
        .tensor("next.weight", &[512], 8, vec![0; 16 * 34]);
    let e = error_of(&short.bytes());
    assert!(
        e.contains("tensor short.weight (Q4_K")
            && e.contains("288 bytes")
            && e.contains("run into tensor next.weight")
            && e.contains("does not match its type and shape"),
        "{e}"
    );

    // Truncated inside a K-quant tensor's bytes.
    let whole = Writer::new().tensor("k.weight", &[256, 2], 12, q4_k_bytes());
    let bytes = whole.bytes();
    let e = error_of(&bytes[..bytes.len() - 100]);
    assert!(
        e.contains("tensor k.weight (Q4_K") && e.contains("the file is truncated"),
        "{e}"
    );

    // A header that claims more tensors than it holds: one more than written, and far more.
    let two = Writer::new()
        .tensor("a.weight", &[32], 8, vec![0; 34])
        .tensor("b.weight", &[32], 8, vec![0; 34]);
    let mut more = two.bytes();
    more[8..16].copy_from_slice(&3u64.to_le_bytes());
    let e = error_of(&more);
    assert!(
        e.contains("the header claims 3 tensors") && e.contains("tensor 3 of them"),
        "{e}"
    );
    let mut absurd = two.bytes();
    absurd[8..16].copy_from_slice(&(1u64 << 40).to_le_bytes());
    let e = error_of(&absurd);
    assert!(
        e.contains("the header claims 1099511627776 tensors") && e.contains("truncated"),
        "{e}"
    );

    // An offset that breaks the file's alignment.
    let mut misaligned = Writer::new()
        .tensor("a.weight", &[32], 8, vec![0; 34])
        .bytes();
    // The offset is the info's last 8 bytes: name length 8 + "a.weight" 8 + dims 4 + 8 + type 4.
    let at = 4 + 4 + 8 + 8 + 8 + 8 + 4 + 8 + 4;
    misaligned[at..at + 8].copy_from_slice(&3u64.to_le_bytes());
    let e = error_of(&misaligned);
    assert!(
        e.contains("tensor a.weight starts at data offset 3") && e.contains("alignment 32"),
        "{e}"
    );
}

#[test]
fn types_without_a_loader_are_refused_naming_the_tensor_the_type_and_what_is_supported() {
    // IQ2_XXS (16), TQ2_0 (35), MXFP4 (39): sizes known, so the file opens and lists them.
    let w = Writer::new()
        .tensor("iq.weight", &[256], 16, vec![0; 66])
        .tensor("tq.weight", &[256], 35, vec![0; 66])
        .tensor("mx.weight", &[32], 39, vec![0; 17]);
    let (_dir, file) = open(&w);
    let file = file.expect("opens");
    for (name, ty) in [
        ("iq.weight", "IQ2_XXS"),
        ("tq.weight", "TQ2_0"),
        ("mx.weight", "MXFP4"),
    ] {
        let e = file
            .load(name, FloatDtype::F16)
            .expect_err("refused")
            .to_string();
        assert!(
            e.contains(&format!("tensor {name} is stored as {ty}"))
                && e.contains("Q4_K, Q5_K and Q6_K"),
            "{e}"
        );
        let info = file.tensor(name).expect("listed").clone();
        let e = file.pack(&info, None).expect_err("not packed").to_string();
        assert!(e.contains(name) && e.contains(ty), "{e}");
    }
}
