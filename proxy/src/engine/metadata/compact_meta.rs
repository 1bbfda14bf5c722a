//! An [`ObjectMeta`] in 28 bytes, as the metadata cache (`url_lru.rs`) and the listed versions
//! (`dir_versions.rs`) hold millions of them: a slot must hold ~47 million small objects' metadata
//! in under 100 B of memory each, and an `ObjectMeta` is 80 B plus two heap strings.
//!
//! The common case is held inline: an ETag that is a lowercase 32-hex MD5, quoted or not (what S3
//! and most S3-compatible servers give an object uploaded in one part), a local file's
//! `<inode>-<mtime µs>-<size>` in lowercase hex (what a directory origin gives), or no ETag; no
//! version; a size under 2^48 (256 TiB) and a Last-Modified within ±2^44 ms (±550 years) of the
//! epoch. Anything else (multipart ETags, versioned buckets) is *spilled*: the whole
//! `ObjectMeta` goes to a side slab ([`Spills`]) and the inline bytes hold its index. Both forms
//! give back exactly the `ObjectMeta` that was put.

use memarts_disk::meta_table::etag::{self, Form, PackedEtag};
use memarts_disk::meta_table::Entry;
use memarts_protocol::ObjectMeta;
use serde::{Deserialize, Serialize};

/// What the three top bits of [`PackedMeta::hi`] say of the ETag: none, spilled, or the form
/// (`memarts_disk::meta_table::etag`, the metadata table's own) of one held in the 16 bytes with
/// no argument: an MD5, bare or quoted, or a local file's.
const NO_ETAG: u32 = 0;
const SPILLED: u32 = 7;
const _: () = assert!(Form::Md5 as u32 != SPILLED && Form::Md5Quoted as u32 != SPILLED);
const _: () = assert!(Form::LocalFile as u32 != SPILLED && Form::Md5 as u32 != NO_ETAG);

const SIZE_BITS: u32 = 48;
const MODIFIED_BITS: u32 = 45;
const FORM_SHIFT: u32 = 29;

/// One object's metadata, packed (see the module docs). Copying it copies an index into its
/// [`Spills`] when spilled: whoever drops it for good calls [`PackedMeta::release`].
#[derive(Clone, Copy, Debug)]
pub struct PackedMeta {
    /// The MD5 of the ETag, a local file's inode and mtime (little-endian), or the spill index
    /// (first 4 bytes, little-endian).
    etag: [u8; 16],
    size_lo: u32,
    modified_lo: u32,
    /// Bits 0-15: size bits 32-47; bits 16-28: Last-Modified bits 32-44 (two's complement);
    /// bits 29-31: the ETag's form.
    hi: u32,
}

/// An [`ObjectMeta`] borrowed: what is packed, from an `ObjectMeta` or straight from the bytes of a
/// snapshot (`meta_cache.rs`), whose entries it reads without making their strings. Serialized
/// exactly as an `ObjectMeta` is (the same fields in the same order).
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct MetaRef<'a> {
    pub size: u64,
    #[serde(borrow)]
    pub etag: Option<&'a str>,
    #[serde(borrow)]
    pub version: Option<&'a str>,
    pub last_modified_ms: i64,
}

impl<'a> From<&'a ObjectMeta> for MetaRef<'a> {
    fn from(meta: &'a ObjectMeta) -> MetaRef<'a> {
        MetaRef {
            size: meta.size,
            etag: meta.etag.as_deref(),
            version: meta.version.as_deref(),
            last_modified_ms: meta.last_modified_ms,
        }
    }
}

impl MetaRef<'_> {
    fn to_owned(self) -> ObjectMeta {
        ObjectMeta {
            size: self.size,
            etag: self.etag.map(str::to_owned),
            version: self.version.map(str::to_owned),
            last_modified_ms: self.last_modified_ms,
        }
    }
}

/// The metadata that does not pack, by index; freed indices are reused.
#[derive(Default, Debug)]
pub struct Spills {
    held: Vec<Option<ObjectMeta>>,
    free: Vec<u32>,
}

impl Spills {
    fn put(&mut self, meta: ObjectMeta) -> u32 {
        match self.free.pop() {
            Some(i) => {
                self.held[i as usize] = Some(meta);
                i
            }
            None => {
                self.held.push(Some(meta));
                (self.held.len() - 1) as u32
            }
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.held.len() - self.free.len()
    }
}

impl PackedMeta {
    /// Packs `meta`, spilling it into `spills` if it does not fit inline.
    pub fn new<'a>(meta: impl Into<MetaRef<'a>>, spills: &mut Spills) -> PackedMeta {
        let meta: MetaRef = meta.into();
        let modified = meta.last_modified_ms;
        let modified_fits = (-(1i64 << (MODIFIED_BITS - 1))..1i64 << (MODIFIED_BITS - 1)).contains(&modified);
        let form = match meta.etag {
            None => Some((NO_ETAG, [0; 16])),
            Some(text) => etag::pack(text, meta.size)
                .filter(|p| matches!(p.form, Form::Md5 | Form::Md5Quoted | Form::LocalFile))
                .map(|p| (p.form as u32, p.bytes)),
        };
        match form {
            Some((form, md5)) if meta.version.is_none() && meta.size >> SIZE_BITS == 0 && modified_fits => {
                let modified = modified as u64 & ((1 << MODIFIED_BITS) - 1);
                PackedMeta {
                    etag: md5,
                    size_lo: meta.size as u32,
                    modified_lo: modified as u32,
                    hi: (meta.size >> 32) as u32 | ((modified >> 32) as u32) << 16 | form << FORM_SHIFT,
                }
            }
            _ => {
                let mut etag = [0; 16];
                etag[..4].copy_from_slice(&spills.put(meta.to_owned()).to_le_bytes());
                PackedMeta { etag, size_lo: 0, modified_lo: 0, hi: SPILLED << FORM_SHIFT }
            }
        }
    }

    fn form(&self) -> u32 {
        self.hi >> FORM_SHIFT
    }

    /// The size of an inline one.
    fn size(&self) -> u64 {
        ((self.hi & 0xffff) as u64) << 32 | self.size_lo as u64
    }

    /// The Last-Modified of an inline one.
    fn modified(&self) -> i64 {
        let modified = (((self.hi >> 16) & 0x1fff) as u64) << 32 | self.modified_lo as u64;
        ((modified << (64 - MODIFIED_BITS)) as i64) >> (64 - MODIFIED_BITS)
    }

    fn spill_index(&self) -> usize {
        u32::from_le_bytes(self.etag[..4].try_into().expect("4 bytes")) as usize
    }

    /// The `ObjectMeta` that was packed.
    pub fn meta(&self, spills: &Spills) -> ObjectMeta {
        let form = self.form();
        if form == SPILLED {
            return spills.held[self.spill_index()]
                .clone()
                .expect("a packed meta's spill is held until released");
        }
        let (size, modified) = (self.size(), self.modified());
        let etag = match form {
            NO_ETAG => None,
            form => {
                let form = Form::from_u8(form as u8).expect("a form packed here");
                etag::unpack(&PackedEtag { form, arg: 0, bytes: self.etag }, size)
            }
        };
        ObjectMeta { size, etag, version: None, last_modified_ms: modified }
    }

    /// What the metadata table shims read says of it, verified at `verified_ms` (`None`: nothing,
    /// as for an object without an ETag). The inline forms are the table's own, so they go in as
    /// they are held; a spilled one is packed from its `ObjectMeta`.
    pub fn entry(&self, spills: &Spills, verified_ms: u64) -> Option<Entry> {
        match self.form() {
            NO_ETAG => None,
            SPILLED => super::meta_publisher::entry(&self.meta(spills), verified_ms),
            form => Some(Entry {
                size: self.size(),
                etag: PackedEtag {
                    form: Form::from_u8(form as u8).expect("a form packed here"),
                    arg: 0,
                    bytes: self.etag,
                },
                last_modified_ms: self.modified(),
                verified_ms,
            }),
        }
    }

    /// Whether it names a version: a non-empty ETag (`dir_versions::versioned`), told without
    /// unpacking the common forms.
    pub fn versioned(&self, spills: &Spills) -> bool {
        match self.form() {
            NO_ETAG => false,
            SPILLED => super::dir_versions::versioned(&self.meta(spills)),
            _ => true,
        }
    }

    /// Frees its spill, if any: it is dropped for good (or replaced).
    pub fn release(&self, spills: &mut Spills) {
        if self.form() == SPILLED {
            let i = self.spill_index();
            spills.held[i] = None;
            spills.free.push(i as u32);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(meta: ObjectMeta, spilled: bool) {
        let mut spills = Spills::default();
        let packed = PackedMeta::new(&meta, &mut spills);
        assert_eq!(packed.meta(&spills), meta);
        assert_eq!(spills.len(), spilled as usize, "{meta:?}");
        // Published as the metadata table packs the ETag it is given.
        assert_eq!(packed.entry(&spills, 5), super::super::meta_publisher::entry(&meta, 5), "{meta:?}");
        packed.release(&mut spills);
        assert_eq!(spills.len(), 0);
    }

    /// A snapshot's entries are read as `MetaRef`s from what was written as `ObjectMeta`s (older
    /// snapshots) and the other way round.
    #[test]
    fn a_meta_ref_is_serialized_as_an_object_meta() {
        let meta = ObjectMeta {
            size: 1 << 40,
            etag: Some("\"e\"".into()),
            version: Some("v7".into()),
            last_modified_ms: -3,
        };
        let bytes = postcard::to_allocvec(&meta).unwrap();
        assert_eq!(postcard::to_allocvec(&MetaRef::from(&meta)).unwrap(), bytes);
        let back: MetaRef = postcard::from_bytes(&bytes).unwrap();
        assert_eq!(back.to_owned(), meta);
        let none = ObjectMeta { etag: None, version: None, ..meta };
        let bytes = postcard::to_allocvec(&none).unwrap();
        let back: MetaRef = postcard::from_bytes(&bytes).unwrap();
        assert_eq!(back.to_owned(), none);
    }

    #[test]
    fn every_meta_comes_back_as_it_was_put() {
        let md5 = "9e107d9d372bb6826bd81d3542a419d6";
        let m = |etag: Option<&str>, size: u64, modified: i64| ObjectMeta {
            size,
            etag: etag.map(String::from),
            version: None,
            last_modified_ms: modified,
        };
        assert_eq!(std::mem::size_of::<PackedMeta>(), 28);
        for (etag, size, modified) in [
            (Some(format!("\"{md5}\"")), 1, 1_700_000_000_123),
            (Some(md5.to_string()), (1 << 48) - 1, -1),
            (None, 0, (1 << 44) - 1),
            (None, 5 << 40, -(1 << 44)),
            (Some("3a1f2b-5f8e9a1c2d3e4-1000".to_string()), 0x1000, 1_700_000_000_123),
            (Some("0-0-1".to_string()), 1, 0),
        ] {
            round_trip(m(etag.as_deref(), size, modified), false);
        }
        for (etag, size, modified) in [
            (Some(md5.to_uppercase()), 1, 0),
            (Some(format!("\"{md5}-12\"")), 1, 0),
            (Some(format!("\"{md5}")), 1, 0),
            (Some(String::new()), 1, 0),
            (Some("\"\"".to_string()), 1, 0),
            (Some("3a1f2b-5f8e9a1c2d3e4-1000".to_string()), 1, 0),
            (Some("3A1f2b-5f8e9a1c2d3e4-1".to_string()), 1, 0),
            (Some("03a1f2b-5f8e9a1c2d3e4-1".to_string()), 1, 0),
            (Some("3a1f2b-5f8e9a1c2d3e4-1-1".to_string()), 1, 0),
            (Some("-5f8e9a1c2d3e4-1".to_string()), 1, 0),
            (Some("+3a1f2b-5f8e9a1c2d3e4-1".to_string()), 1, 0),
            (None, 1 << 48, 0),
            (None, 1, 1 << 44),
            (None, 1, i64::MIN),
        ] {
            round_trip(m(etag.as_deref(), size, modified), true);
        }
        round_trip(ObjectMeta { version: Some("v1".into()), ..m(Some(md5), 1, 0) }, true);
    }

    #[test]
    fn a_version_is_a_non_empty_etag_in_either_form() {
        let mut spills = Spills::default();
        for (etag, versioned) in [
            (None, false),
            (Some(""), false),
            (Some("\"e\""), true),
            (Some("\"0123456789abcdef0123456789abcdef\""), true),
        ] {
            let meta =
                ObjectMeta { size: 1, etag: etag.map(String::from), version: None, last_modified_ms: 0 };
            assert_eq!(PackedMeta::new(&meta, &mut spills).versioned(&spills), versioned, "{etag:?}");
        }
    }
}
