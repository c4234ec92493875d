//! The snapshot file format, sans-IO: a fixed 64-byte header, then the payload — a run of
//! tagged sections, each an rkyv archive. [`encode`] builds a whole file in memory;
//! [`decode`] checks a whole file (header, bounds, checksums, each archive through rkyv's
//! validated access) and returns owned [`Contents`] or the one [`Problem`] that makes it
//! untrustworthy. Nothing here panics on any input.
//!
//! ```text
//! header (64 bytes, little-endian)
//!   0  magic            8  b"TGSNAPSH"
//!   8  schema_version   4  SCHEMA_VERSION (the header and section framing)
//!  12  header_len       4  64
//!  16  generation       8  grows by one per write; the newest valid slot wins
//!  24  written_at       8  wall-clock ms
//!  32  payload_len      8  ≤ MAX_PAYLOAD_BYTES; the file is exactly 64 + payload_len
//!  40  payload_xxh3     8  XXH3-64 of the payload
//!  48  section_count    4
//!  52  reserved         4  0
//!  56  header_xxh3      8  XXH3-64 of bytes 0..56
//! section (repeated section_count times; starts 16-aligned)
//!   0  tag 4, version 4, len 8   then `len` bytes of rkyv archive, zero-padded to 16
//! ```
//!
//! Sections start at multiples of 16 from the start of the file, and the file is mapped
//! page-aligned, so each archive is aligned for rkyv's validated access without a copy.
//! An unknown tag, or a known tag at a newer section version, is skipped and reported,
//! never an error: that is how state is added without changing `SCHEMA_VERSION`.

use rkyv::rancor;
use rkyv::util::AlignedVec;

use super::schema::{
    self, AFFINITY_PINS_VERSION, BREAKERS_VERSION, CONNECTION_OVERRIDES_VERSION,
    CONNECTIONS_VERSION, Contents, LEASES_VERSION, PROVIDER_COOLDOWNS_VERSION,
    RUNTIME_SETTINGS_VERSION, Section, SkippedSection, tag,
};

/// First bytes of every snapshot file.
pub const MAGIC: [u8; 8] = *b"TGSNAPSH";
/// Version of the header and the section framing.
pub const SCHEMA_VERSION: u32 = 1;
/// Header size in bytes.
pub const HEADER_BYTES: usize = 64;
/// Section header size in bytes; also the alignment of every section.
pub const SECTION_HEADER_BYTES: usize = 16;
/// The largest payload written or read: a larger length is corruption, not state.
pub const MAX_PAYLOAD_BYTES: u64 = 256 * 1024 * 1024;
/// The most sections a file may declare.
pub const MAX_SECTIONS: u32 = 1024;

/// The header of a valid file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub schema_version: u32,
    pub generation: u64,
    pub written_at_wall_ms: u64,
    pub payload_len: u64,
    pub section_count: u32,
}

/// Why a file is not trusted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Problem {
    Empty,
    /// Shorter than the header.
    Truncated {
        len: usize,
    },
    BadMagic,
    /// Written by a newer Tidegate.
    FutureVersion(u32),
    UnknownVersion(u32),
    HeaderChecksum,
    PayloadTooLarge(u64),
    /// The file is not exactly header + payload long.
    LengthMismatch {
        expected: u64,
        actual: u64,
    },
    PayloadChecksum,
    /// The section framing runs past the payload or is inconsistent.
    Framing(String),
    /// rkyv's validation refused a section's archive.
    Archive {
        tag: u32,
        error: String,
    },
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Problem::Empty => f.write_str("zero-length file"),
            Problem::Truncated { len } => {
                write!(
                    f,
                    "truncated: {len} bytes, shorter than the {HEADER_BYTES}-byte header"
                )
            }
            Problem::BadMagic => f.write_str("not a Tidegate snapshot (wrong magic)"),
            Problem::FutureVersion(v) => write!(
                f,
                "schema version {v} is newer than this release reads ({SCHEMA_VERSION})"
            ),
            Problem::UnknownVersion(v) => write!(f, "unknown schema version {v}"),
            Problem::HeaderChecksum => f.write_str("header checksum mismatch"),
            Problem::PayloadTooLarge(n) => {
                write!(
                    f,
                    "payload length {n} exceeds the {MAX_PAYLOAD_BYTES}-byte limit"
                )
            }
            Problem::LengthMismatch { expected, actual } => write!(
                f,
                "file is {actual} bytes, the header says {expected} (truncated or padded)"
            ),
            Problem::PayloadChecksum => f.write_str("payload checksum mismatch"),
            Problem::Framing(why) => write!(f, "bad section framing: {why}"),
            Problem::Archive { tag: t, error } => {
                write!(
                    f,
                    "section {} ({t}) failed validation: {error}",
                    tag::name(*t)
                )
            }
        }
    }
}

fn xxh3(bytes: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(bytes)
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    if let Some(s) = b.get(at..at + 4) {
        a.copy_from_slice(s);
    }
    u32::from_le_bytes(a)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    if let Some(s) = b.get(at..at + 8) {
        a.copy_from_slice(s);
    }
    u64::from_le_bytes(a)
}

fn pad16(n: usize) -> usize {
    n.div_ceil(SECTION_HEADER_BYTES) * SECTION_HEADER_BYTES
}

/// Why [`encode`] could not build a file.
#[derive(Debug)]
pub struct EncodeError(pub String);

impl std::fmt::Display for EncodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn push_section(out: &mut Vec<u8>, tag: u32, version: u32, body: &[u8]) {
    out.extend_from_slice(&tag.to_le_bytes());
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&(body.len() as u64).to_le_bytes());
    out.extend_from_slice(body);
    out.resize(pad16(out.len()), 0);
}

/// One section's archive: `entries` as a [`Section`].
fn archive<T>(entries: Vec<T>) -> Result<AlignedVec, EncodeError>
where
    Section<T>: for<'a> rkyv::Serialize<
            rkyv::api::high::HighSerializer<
                AlignedVec,
                rkyv::ser::allocator::ArenaHandle<'a>,
                rancor::Error,
            >,
        >,
{
    rkyv::to_bytes::<rancor::Error>(&Section { entries }).map_err(|e| EncodeError(e.to_string()))
}

/// A whole file: header and every section of `contents` (skipped sections are not
/// re-written: a release writes what it reads).
pub fn encode(
    generation: u64,
    written_at_wall_ms: u64,
    contents: Contents,
) -> Result<Vec<u8>, EncodeError> {
    let sections: [(u32, u32, AlignedVec); 7] = [
        (tag::BREAKERS, BREAKERS_VERSION, archive(contents.breakers)?),
        (
            tag::CONNECTIONS,
            CONNECTIONS_VERSION,
            archive(contents.connections)?,
        ),
        (
            tag::PROVIDER_COOLDOWNS,
            PROVIDER_COOLDOWNS_VERSION,
            archive(contents.provider_cooldowns)?,
        ),
        (
            tag::RUNTIME_SETTINGS,
            RUNTIME_SETTINGS_VERSION,
            archive(contents.runtime_settings)?,
        ),
        (
            tag::CONNECTION_OVERRIDES,
            CONNECTION_OVERRIDES_VERSION,
            archive(contents.connection_overrides)?,
        ),
        (
            tag::AFFINITY_PINS,
            AFFINITY_PINS_VERSION,
            archive(contents.affinity_pins)?,
        ),
        (tag::LEASES, LEASES_VERSION, archive(contents.leases)?),
    ];
    let payload_len: usize = sections
        .iter()
        .map(|(_, _, b)| SECTION_HEADER_BYTES + pad16(b.len()))
        .sum();
    if payload_len as u64 > MAX_PAYLOAD_BYTES {
        return Err(EncodeError(format!(
            "snapshot payload of {payload_len} bytes exceeds the {MAX_PAYLOAD_BYTES}-byte limit"
        )));
    }
    let mut out = Vec::with_capacity(HEADER_BYTES + payload_len);
    out.resize(HEADER_BYTES, 0);
    for (t, v, body) in &sections {
        push_section(&mut out, *t, *v, body);
    }
    let payload_sum = xxh3(&out[HEADER_BYTES..]);
    let mut h = [0u8; HEADER_BYTES];
    h[0..8].copy_from_slice(&MAGIC);
    h[8..12].copy_from_slice(&SCHEMA_VERSION.to_le_bytes());
    h[12..16].copy_from_slice(&(HEADER_BYTES as u32).to_le_bytes());
    h[16..24].copy_from_slice(&generation.to_le_bytes());
    h[24..32].copy_from_slice(&written_at_wall_ms.to_le_bytes());
    h[32..40].copy_from_slice(&(payload_len as u64).to_le_bytes());
    h[40..48].copy_from_slice(&payload_sum.to_le_bytes());
    h[48..52].copy_from_slice(&(sections.len() as u32).to_le_bytes());
    let header_sum = xxh3(&h[0..56]);
    h[56..64].copy_from_slice(&header_sum.to_le_bytes());
    out[..HEADER_BYTES].copy_from_slice(&h);
    Ok(out)
}

/// Checks the header and the file's length and payload checksum.
pub fn check_header(bytes: &[u8]) -> Result<Header, Problem> {
    if bytes.is_empty() {
        return Err(Problem::Empty);
    }
    if bytes.len() < HEADER_BYTES {
        if !bytes.starts_with(&MAGIC[..bytes.len().min(MAGIC.len())]) {
            return Err(Problem::BadMagic);
        }
        return Err(Problem::Truncated { len: bytes.len() });
    }
    if bytes[0..8] != MAGIC {
        return Err(Problem::BadMagic);
    }
    if xxh3(&bytes[0..56]) != u64_at(bytes, 56) {
        return Err(Problem::HeaderChecksum);
    }
    let schema_version = u32_at(bytes, 8);
    if schema_version > SCHEMA_VERSION {
        return Err(Problem::FutureVersion(schema_version));
    }
    if schema_version != SCHEMA_VERSION || u32_at(bytes, 12) as usize != HEADER_BYTES {
        return Err(Problem::UnknownVersion(schema_version));
    }
    let payload_len = u64_at(bytes, 32);
    if payload_len > MAX_PAYLOAD_BYTES {
        return Err(Problem::PayloadTooLarge(payload_len));
    }
    let expected = HEADER_BYTES as u64 + payload_len;
    if bytes.len() as u64 != expected {
        return Err(Problem::LengthMismatch {
            expected,
            actual: bytes.len() as u64,
        });
    }
    if xxh3(&bytes[HEADER_BYTES..]) != u64_at(bytes, 40) {
        return Err(Problem::PayloadChecksum);
    }
    let section_count = u32_at(bytes, 48);
    if section_count > MAX_SECTIONS {
        return Err(Problem::Framing(format!("{section_count} sections")));
    }
    Ok(Header {
        schema_version,
        generation: u64_at(bytes, 16),
        written_at_wall_ms: u64_at(bytes, 24),
        payload_len,
        section_count,
    })
}

/// A section as framed in the file.
#[derive(Clone, Copy, Debug)]
pub struct RawSection<'a> {
    pub tag: u32,
    pub version: u32,
    pub body: &'a [u8],
}

/// The sections of a file whose header checked.
pub fn sections<'a>(bytes: &'a [u8], header: &Header) -> Result<Vec<RawSection<'a>>, Problem> {
    let mut out = Vec::new();
    let mut at = HEADER_BYTES;
    for i in 0..header.section_count {
        let Some(head) = bytes.get(at..at + SECTION_HEADER_BYTES) else {
            return Err(Problem::Framing(format!("section {i} header past the end")));
        };
        let len = u64_at(head, 8);
        let start = at + SECTION_HEADER_BYTES;
        let body = usize::try_from(len)
            .ok()
            .and_then(|len| start.checked_add(len).map(|end| (len, end)))
            .and_then(|(len, end)| bytes.get(start..end).map(|b| (len, b)));
        let Some((len, body)) = body else {
            return Err(Problem::Framing(format!("section {i} runs past the end")));
        };
        out.push(RawSection {
            tag: u32_at(head, 0),
            version: u32_at(head, 4),
            body,
        });
        at = start + pad16(len);
    }
    if at != bytes.len() {
        return Err(Problem::Framing(format!(
            "{} bytes after the last section",
            bytes.len().saturating_sub(at)
        )));
    }
    Ok(out)
}

/// Validates a section's archive with rkyv and deserializes its entries. A body that is
/// not 16-aligned in memory (a buffer that was not mapped) is copied into one that is.
fn read_section<T>(t: u32, body: &[u8]) -> Result<Vec<T>, Problem>
where
    Section<T>: rkyv::Archive,
    <Section<T> as rkyv::Archive>::Archived: for<'a> rkyv::bytecheck::CheckBytes<rkyv::api::high::HighValidator<'a, rancor::Error>>
        + rkyv::Deserialize<Section<T>, rkyv::api::high::HighDeserializer<rancor::Error>>,
{
    let err = |e: rancor::Error| Problem::Archive {
        tag: t,
        error: e.to_string(),
    };
    let copy;
    let aligned: &[u8] = if (body.as_ptr() as usize).is_multiple_of(SECTION_HEADER_BYTES) {
        body
    } else {
        let mut v = AlignedVec::<16>::with_capacity(body.len());
        v.extend_from_slice(body);
        copy = v;
        &copy
    };
    let archived = rkyv::access::<<Section<T> as rkyv::Archive>::Archived, rancor::Error>(aligned)
        .map_err(err)?;
    let section: Section<T> =
        rkyv::deserialize::<Section<T>, rancor::Error>(archived).map_err(err)?;
    Ok(section.entries)
}

/// A whole file, checked and decoded.
pub fn decode(bytes: &[u8]) -> Result<(Header, Contents), Problem> {
    let header = check_header(bytes)?;
    let mut contents = Contents::default();
    for s in sections(bytes, &header)? {
        let (t, body) = (s.tag, s.body);
        match (s.tag, s.version) {
            (tag::BREAKERS, BREAKERS_VERSION) => contents.breakers = read_section(t, body)?,
            (tag::CONNECTIONS, CONNECTIONS_VERSION) => {
                contents.connections = read_section(t, body)?;
            }
            (tag::PROVIDER_COOLDOWNS, PROVIDER_COOLDOWNS_VERSION) => {
                contents.provider_cooldowns = read_section(t, body)?;
            }
            (tag::RUNTIME_SETTINGS, RUNTIME_SETTINGS_VERSION) => {
                contents.runtime_settings = read_section(t, body)?;
            }
            (tag::CONNECTION_OVERRIDES, CONNECTION_OVERRIDES_VERSION) => {
                contents.connection_overrides = read_section(t, body)?;
            }
            (tag::AFFINITY_PINS, AFFINITY_PINS_VERSION) => {
                contents.affinity_pins = read_section(t, body)?;
            }
            (tag::LEASES, LEASES_VERSION) => contents.leases = read_section(t, body)?,
            (t, v) => contents.skipped_sections.push(SkippedSection {
                tag: t,
                name: schema::tag::name(t),
                version: v,
                bytes: s.body.len() as u64,
            }),
        }
    }
    Ok((header, contents))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::schema::{
        BreakerEntry, ConnectionEntry, ConnectionOverrideEntry, LeaseEntry, ModelCapEntry,
        PinEntry, SettingsPatchEntry, TrackerEntry,
    };

    pub(crate) fn sample() -> Contents {
        Contents {
            breakers: vec![BreakerEntry {
                provider: "p".into(),
                connection: None,
                state: "OPEN".into(),
                failure_count: 5,
                last_failure_wall_ms: Some(1_000),
                last_failure_kind: Some("transient".into()),
                open_cycle_count: 1,
                transient_failures: 5,
                rate_limit_failures: 0,
                quota_exhausted_failures: 0,
                open_until_wall_ms: Some(61_000),
            }],
            connections: vec![ConnectionEntry {
                connection: "c".into(),
                provider: "p".into(),
                test_status: "banned".into(),
                rate_limited_until_wall_ms: None,
                cooldown_reason: None,
                backoff_level: 2,
                last_error: Some("account suspended".into()),
                last_error_type: Some("account_deactivated".into()),
                error_code: Some(403),
                last_error_at_wall_ms: Some(900),
                reject_streak: None,
                expired_strikes: None,
            }],
            provider_cooldowns: vec![TrackerEntry {
                provider: "p".into(),
                connection: None,
                last_failure_wall_ms: 1_000,
                failure_count: 2,
                retention_ms: 1_800_000,
                failure_timestamps_wall_ms: vec![900, 1_000],
            }],
            runtime_settings: vec![SettingsPatchEntry {
                patch_json: r#"{"providerBreaker":{"apikey":{"failureThreshold":3}}}"#.into(),
            }],
            connection_overrides: vec![ConnectionOverrideEntry {
                connection: "c".into(),
                provider: "p".into(),
                max_concurrent: Some(4),
                rl_max_concurrent: None,
                rl_model_concurrency: vec![ModelCapEntry {
                    model: "m".into(),
                    cap: 2,
                }],
                rl_max_wait_ms: Some(1_000),
                rl_execution_max_wait_ms: None,
                rl_requests_per_minute: Some(60),
                rl_min_time_between_requests_ms: None,
            }],
            affinity_pins: vec![PinEntry {
                provider: "p".into(),
                session: "ab".repeat(32),
                connection: "c".into(),
                created_wall_ms: 1,
                last_used_wall_ms: 2,
                expires_wall_ms: 3,
            }],
            leases: vec![LeaseEntry {
                owner: "cd".repeat(32),
                key: "agent".into(),
                provider: "p".into(),
                connection: "c".into(),
                generation: 2,
                state: "ACTIVE".into(),
                acquired_wall_ms: 1,
                renewed_wall_ms: 2,
                expires_wall_ms: 120_002,
                ended_wall_ms: 0,
            }],
            skipped_sections: Vec::new(),
        }
    }

    fn file() -> Vec<u8> {
        encode(7, 123, sample()).unwrap()
    }

    /// Re-seals a header after a test edits it (so the check under test is reached).
    fn reseal(b: &mut [u8]) {
        let sum = xxh3(&b[0..56]);
        b[56..64].copy_from_slice(&sum.to_le_bytes());
    }

    #[test]
    fn round_trip() {
        let (h, c) = decode(&file()).unwrap();
        assert_eq!((h.generation, h.written_at_wall_ms), (7, 123));
        assert_eq!(c, sample());
    }

    #[test]
    fn every_damage_is_a_problem_never_a_panic() {
        let good = file();
        assert_eq!(decode(&[]).unwrap_err(), Problem::Empty);
        for cut in [1, 8, 63, 64, 65, good.len() - 1] {
            assert!(decode(&good[..cut]).is_err(), "cut at {cut}");
        }
        let mut padded = good.clone();
        padded.push(0);
        assert!(matches!(
            decode(&padded),
            Err(Problem::LengthMismatch { .. })
        ));
        let mut magic = good.clone();
        magic[0] = b'X';
        assert_eq!(decode(&magic).unwrap_err(), Problem::BadMagic);
        let mut future = good.clone();
        future[8..12].copy_from_slice(&(SCHEMA_VERSION + 1).to_le_bytes());
        reseal(&mut future);
        assert_eq!(
            decode(&future).unwrap_err(),
            Problem::FutureVersion(SCHEMA_VERSION + 1)
        );
        let mut huge = good.clone();
        huge[32..40].copy_from_slice(&(MAX_PAYLOAD_BYTES + 1).to_le_bytes());
        reseal(&mut huge);
        assert!(matches!(decode(&huge), Err(Problem::PayloadTooLarge(_))));
        // Every single flipped bit anywhere is caught.
        for i in 0..good.len() {
            let mut b = good.clone();
            b[i] ^= 0x10;
            assert!(decode(&b).is_err(), "flip at {i}");
        }
    }

    #[test]
    fn a_bad_archive_behind_a_good_checksum_is_refused_by_validation() {
        let mut b = file();
        // Scribble over the first section's body, then fix both checksums: only rkyv's
        // validation stands between this and a wild pointer.
        for x in &mut b[HEADER_BYTES + SECTION_HEADER_BYTES..HEADER_BYTES + 48] {
            *x = 0xff;
        }
        let sum = xxh3(&b[HEADER_BYTES..]);
        b[40..48].copy_from_slice(&sum.to_le_bytes());
        reseal(&mut b);
        assert!(matches!(
            decode(&b),
            Err(Problem::Archive { .. } | Problem::Framing(_))
        ));
    }

    #[test]
    fn unknown_sections_are_skipped_and_reported() {
        let good = file();
        // Append a section with tag 99 and rebuild the header.
        let mut b = good.clone();
        push_section(&mut b, 99, 1, b"hello");
        let count = u32_at(&b, 48) + 1;
        b[48..52].copy_from_slice(&count.to_le_bytes());
        let len = (b.len() - HEADER_BYTES) as u64;
        b[32..40].copy_from_slice(&len.to_le_bytes());
        let sum = xxh3(&b[HEADER_BYTES..]);
        b[40..48].copy_from_slice(&sum.to_le_bytes());
        reseal(&mut b);
        let (_, c) = decode(&b).unwrap();
        assert_eq!(c.breakers, sample().breakers);
        assert_eq!(c.skipped_sections.len(), 1);
        assert_eq!(c.skipped_sections[0].tag, 99);
    }

    #[test]
    fn an_unaligned_buffer_is_still_read() {
        let good = file();
        let mut shifted = vec![0u8; good.len() + 1];
        shifted[1..].copy_from_slice(&good);
        assert_eq!(decode(&shifted[1..]).unwrap().1, sample());
    }
}
