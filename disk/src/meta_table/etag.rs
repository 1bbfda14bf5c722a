//! An ETag in 16 bytes, a form and a 16-bit argument, as a metadata table entry holds it: the
//! forms origins give, each taken only in its canonical spelling, so that the text comes back
//! byte for byte (a shim names chunks by it). An ETag of no form is not published: its object is
//! read through the proxy, as before the table.

/// How an entry's 16 ETag bytes are to be read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Form {
    /// A lowercase 32-hex MD5, bare or quoted: an object uploaded in one part (S3, OBS, OSS, MinIO).
    Md5 = 1,
    Md5Quoted = 2,
    /// `<md5>-<parts>` (parts in the argument, 1 to 65,535): a multipart upload.
    Multipart = 3,
    MultipartQuoted = 4,
    /// Any other ETag of 1 to 16 bytes, as it is (its length in the argument).
    Raw = 5,
    /// A local file's `<inode>-<mtime µs>-<size>` in lowercase hex, whose size is the object's:
    /// inode and mtime, little-endian.
    LocalFile = 6,
}

impl Form {
    pub fn from_u8(v: u8) -> Option<Form> {
        Some(match v {
            1 => Form::Md5,
            2 => Form::Md5Quoted,
            3 => Form::Multipart,
            4 => Form::MultipartQuoted,
            5 => Form::Raw,
            6 => Form::LocalFile,
            _ => return None,
        })
    }
}

/// An ETag packed: its form, argument and bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PackedEtag {
    pub form: Form,
    pub arg: u16,
    pub bytes: [u8; 16],
}

/// `etag` (of an object of `size` bytes) packed, or `None` if it has none of the forms.
pub fn pack(etag: &str, size: u64) -> Option<PackedEtag> {
    let (inner, quoted) = match etag.strip_prefix('"').and_then(|e| e.strip_suffix('"')) {
        Some(inner) => (inner, true),
        None => (etag, false),
    };
    if let Some(md5) = md5_of(inner) {
        let form = if quoted { Form::Md5Quoted } else { Form::Md5 };
        return Some(PackedEtag { form, arg: 0, bytes: md5 });
    }
    if let Some((md5, parts)) = inner.split_once('-').and_then(|(m, n)| Some((md5_of(m)?, n))) {
        let form = if quoted { Form::MultipartQuoted } else { Form::Multipart };
        if let Ok(n) = parts.parse::<u16>() {
            let packed = PackedEtag { form, arg: n, bytes: md5 };
            if n > 0 && unpack(&packed, size).as_deref() == Some(etag) {
                return Some(packed);
            }
        }
    }
    if let Some(packed) = local_file_of(etag, size) {
        return Some(packed);
    }
    if (1..=16).contains(&etag.len()) {
        let mut bytes = [0; 16];
        bytes[..etag.len()].copy_from_slice(etag.as_bytes());
        return Some(PackedEtag { form: Form::Raw, arg: etag.len() as u16, bytes });
    }
    None
}

/// The ETag text of `packed` (of an object of `size` bytes); `None` if the bytes do not make one
/// (words of a damaged or foreign table).
pub fn unpack(packed: &PackedEtag, size: u64) -> Option<String> {
    let b = &packed.bytes;
    Some(match packed.form {
        Form::Md5 => hex(b),
        Form::Md5Quoted => format!("\"{}\"", hex(b)),
        Form::Multipart => format!("{}-{}", hex(b), packed.arg),
        Form::MultipartQuoted => format!("\"{}-{}\"", hex(b), packed.arg),
        Form::Raw => std::str::from_utf8(b.get(..packed.arg as usize)?).ok()?.to_string(),
        Form::LocalFile => {
            let inode = u64::from_le_bytes(b[..8].try_into().expect("8 bytes"));
            let mtime = u64::from_le_bytes(b[8..].try_into().expect("8 bytes"));
            format!("{inode:x}-{mtime:x}-{size:x}")
        }
    })
}

/// The 16 bytes of a lowercase 32-hex MD5 (uppercase would not come back as it was).
fn md5_of(hex: &str) -> Option<[u8; 16]> {
    let hex = hex.as_bytes();
    if hex.len() != 32 {
        return None;
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut md5 = [0; 16];
    for (byte, pair) in md5.iter_mut().zip(hex.chunks_exact(2)) {
        *byte = digit(pair[0])? << 4 | digit(pair[1])?;
    }
    Some(md5)
}

/// A local file's ETag (`object_store`'s `<inode>-<mtime µs>-<size>`) whose size is `size`.
fn local_file_of(etag: &str, size: u64) -> Option<PackedEtag> {
    let mut parts = etag.split('-');
    let mut next = || u64::from_str_radix(parts.next()?, 16).ok();
    let (inode, mtime, of_size) = (next()?, next()?, next()?);
    let mut bytes = [0; 16];
    bytes[..8].copy_from_slice(&inode.to_le_bytes());
    bytes[8..].copy_from_slice(&mtime.to_le_bytes());
    let packed = PackedEtag { form: Form::LocalFile, arg: 0, bytes };
    (of_size == size && unpack(&packed, size).as_deref() == Some(etag)).then_some(packed)
}

fn hex(bytes: &[u8; 16]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    bytes.iter().flat_map(|b| [HEX[(b >> 4) as usize] as char, HEX[(b & 15) as usize] as char]).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_form_comes_back_as_it_was_and_others_are_not_packed() {
        let md5 = "9e107d9d372bb6826bd81d3542a419d6";
        let size = 0x1000;
        for (etag, form) in [
            (md5.to_string(), Form::Md5),
            (format!("\"{md5}\""), Form::Md5Quoted),
            (format!("{md5}-12"), Form::Multipart),
            (format!("\"{md5}-65535\""), Form::MultipartQuoted),
            ("\"etag-a\"".to_string(), Form::Raw),
            ("0123456789abcdef".to_string(), Form::Raw),
            ("3a1f2b-5f8e9a1c2d3e4-1000".to_string(), Form::LocalFile),
            // Not of its form (the size differs): kept as it is, being short enough.
            ("3a1f2b-5f8e-1".to_string(), Form::Raw),
        ] {
            let packed = pack(&etag, size).unwrap_or_else(|| panic!("{etag} not packed"));
            assert_eq!(packed.form, form, "{etag}");
            assert_eq!(unpack(&packed, size).as_deref(), Some(etag.as_str()));
        }
        for etag in [
            String::new(),
            md5.to_uppercase(),
            format!("\"{md5}-0\""),
            format!("\"{md5}-012\""),
            format!("\"{md5}-65536\""),
            format!("{md5}-+1"),
            "03a1f2b-5f8e9a1c2d3e4-1000".to_string(),
            "x".repeat(17),
        ] {
            assert_eq!(pack(&etag, size), None, "{etag}");
        }
    }

    #[test]
    fn damaged_words_make_no_etag_or_one_of_their_form() {
        let raw = PackedEtag { form: Form::Raw, arg: 17, bytes: [b'a'; 16] };
        assert_eq!(unpack(&raw, 1), None);
        let not_utf8 = PackedEtag { form: Form::Raw, arg: 2, bytes: [0xff; 16] };
        assert_eq!(unpack(&not_utf8, 1), None);
        assert_eq!(Form::from_u8(0), None);
        assert_eq!(Form::from_u8(7), None);
    }
}
