//! Mutual authentication of peer connections over the cluster secret (S6): a challenge and response
//! with HMAC-SHA256 (RustCrypto's `hmac` and `sha2`; the comparison is `verify_slice`'s, constant
//! time). Both sides contribute a fresh random nonce, so a recorded exchange cannot be replayed, and
//! each proof names its side and its node, so a client's proof cannot be reflected back as the
//! server's.

use hmac::{Hmac, Mac};
use memarts_protocol::peer::PEER_NONCE_LEN;
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// A nonce or a proof.
pub type Bytes32 = [u8; PEER_NONCE_LEN];

/// Which side a proof is from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Client,
    Server,
}

/// The cluster secret: shared by every member, never logged.
#[derive(Clone)]
pub struct Secret(Vec<u8>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Secret(<{} bytes>)", self.0.len())
    }
}

/// Secrets shorter than this are refused: they could be guessed.
pub const MIN_SECRET_LEN: usize = 16;

impl Secret {
    /// `bytes` with surrounding whitespace (a trailing newline) dropped; `None` if shorter than
    /// [`MIN_SECRET_LEN`].
    pub fn new(bytes: &[u8]) -> Option<Secret> {
        let text = bytes.trim_ascii();
        (text.len() >= MIN_SECRET_LEN).then(|| Secret(text.to_vec()))
    }

    /// Exactly `bytes`, as the cluster's secret file gave them (`config.rs` checks and trims them).
    pub fn from_bytes(bytes: Vec<u8>) -> Secret {
        Secret(bytes)
    }

    fn mac(&self) -> HmacSha256 {
        HmacSha256::new_from_slice(&self.0).expect("HMAC takes a key of any length")
    }

    /// The proof of `side`, node `node`: the HMAC over the side's label, the two nonces in the
    /// order this side sees them (its peer's first) and its node id.
    pub fn proof(&self, side: Side, theirs: &Bytes32, ours: &Bytes32, node: &str) -> Bytes32 {
        let mut mac = self.mac();
        feed(&mut mac, side, theirs, ours, node);
        mac.finalize().into_bytes().into()
    }

    /// Whether `proof` is what `side` (node `node`, which saw `theirs` then `ours`) would send.
    pub fn verify(&self, side: Side, theirs: &Bytes32, ours: &Bytes32, node: &str, proof: &Bytes32) -> bool {
        let mut mac = self.mac();
        feed(&mut mac, side, theirs, ours, node);
        mac.verify_slice(proof).is_ok()
    }
}

fn feed(mac: &mut HmacSha256, side: Side, theirs: &Bytes32, ours: &Bytes32, node: &str) {
    mac.update(match side {
        Side::Client => b"memarts peer v1 client\0",
        Side::Server => b"memarts peer v1 server\0",
    });
    mac.update(theirs);
    mac.update(ours);
    mac.update(&(node.len() as u64).to_le_bytes());
    mac.update(node.as_bytes());
}

/// A fresh random nonce.
pub fn nonce() -> Bytes32 {
    rand::random()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_proof_checks_only_with_the_same_secret_nonces_side_and_node() {
        let secret = Secret::new(b"correct horse battery staple\n").unwrap();
        let (server_nonce, client_nonce) = (nonce(), nonce());
        let client = secret.proof(Side::Client, &server_nonce, &client_nonce, "node-a");
        assert!(secret.verify(Side::Client, &server_nonce, &client_nonce, "node-a", &client));
        let wrong = Secret::new(b"another secret, as long").unwrap();
        assert!(!wrong.verify(Side::Client, &server_nonce, &client_nonce, "node-a", &client));
        assert!(!secret.verify(Side::Client, &nonce(), &client_nonce, "node-a", &client), "replayed");
        assert!(!secret.verify(Side::Client, &server_nonce, &client_nonce, "node-b", &client));
        assert!(!secret.verify(Side::Server, &server_nonce, &client_nonce, "node-a", &client), "reflected");
        let mut flipped = client;
        flipped[0] ^= 1;
        assert!(!secret.verify(Side::Client, &server_nonce, &client_nonce, "node-a", &flipped));
    }

    #[test]
    fn short_secrets_are_refused_and_never_shown() {
        assert!(Secret::new(b"  short \n").is_none());
        let s = Secret::new(b"0123456789abcdef").unwrap();
        assert_eq!(format!("{s:?}"), "Secret(<16 bytes>)");
    }
}
