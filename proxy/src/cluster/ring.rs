//! Which node owns a chunk: weighted rendezvous hashing over the registered members. Every member
//! scores every chunk, `-weight / ln(u)` with `u` the member's hash of the chunk in (0, 1), and the
//! highest score owns it; the order of the scores is the order in which the next owners take over
//! when the owner is away. Removing a member moves only its own chunks, each to the next in its
//! order; a member of twice the weight owns twice as many chunks. The hash mixes the member's id
//! (not its address, which may change) with the chunk's placement (`memarts_protocol::placement`:
//! object, chunk size and index, not the ETag, so a new version of an object stays where it was and
//! the owner of chunk 0 is known before its ETag), independently of the slot hash inside a node.

use super::members::Member;

/// `members` ordered for `chunk`: its owner first, then the next owners in turn.
pub fn owners(members: &[Member], placement: u64) -> Vec<&Member> {
    let mut scored: Vec<(f64, &Member)> = members.iter().map(|m| (score(m, placement), m)).collect();
    // Ties (practically impossible) are broken by id, so every node computes the same order.
    scored.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.id.cmp(&b.1.id)));
    scored.into_iter().map(|(_, m)| m).collect()
}

fn score(member: &Member, placement: u64) -> f64 {
    let mut bytes = Vec::with_capacity(member.id.len() + 9);
    bytes.extend_from_slice(member.id.as_bytes());
    bytes.push(0);
    bytes.extend_from_slice(&placement.to_le_bytes());
    let h = xxhash_rust::xxh3::xxh3_64(&bytes);
    // In (0, 1): never 0 (ln would be -inf) nor 1 (ln would be 0).
    let u = (h as f64 + 0.5) / (u64::MAX as f64 + 1.0);
    let weight = if member.weight.is_finite() && member.weight > 0.0 { member.weight } else { 1.0 };
    -weight / u.ln()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(id: &str, weight: f64) -> Member {
        Member { id: id.into(), address: format!("{id}:7070"), weight }
    }

    fn share(members: &[Member], of: &str, n: u64) -> f64 {
        let owned = (0..n)
            .filter(|c| owners(members, c.wrapping_mul(0x9E37_79B9_7F4A_7C15)).first().unwrap().id == of)
            .count();
        owned as f64 / n as f64
    }

    #[test]
    fn chunks_spread_evenly_and_by_weight() {
        let three = [member("a", 1.0), member("b", 1.0), member("c", 1.0)];
        for id in ["a", "b", "c"] {
            let s = share(&three, id, 30_000);
            assert!((s - 1.0 / 3.0).abs() < 0.02, "{id} owns {s}");
        }
        let weighted = [member("a", 2.0), member("b", 1.0), member("c", 1.0)];
        let s = share(&weighted, "a", 30_000);
        assert!((s - 0.5).abs() < 0.02, "a of weight 2 owns {s}");
    }

    #[test]
    fn removing_a_member_moves_only_its_chunks_to_their_next_owner() {
        let all = [member("a", 1.0), member("b", 1.0), member("c", 1.0), member("d", 1.0)];
        let without_b: Vec<Member> = all.iter().filter(|m| m.id != "b").cloned().collect();
        for c in 0..5_000u64 {
            let chunk = c.wrapping_mul(0xD6E8_FEB8_6659_FD93);
            let order = owners(&all, chunk);
            let after = owners(&without_b, chunk);
            let expected: Vec<&str> = order.iter().map(|m| m.id.as_str()).filter(|id| *id != "b").collect();
            let got: Vec<&str> = after.iter().map(|m| m.id.as_str()).collect();
            assert_eq!(got, expected, "chunk {chunk}");
        }
    }

    #[test]
    fn the_order_does_not_depend_on_addresses_or_on_the_list_order() {
        let a = [member("a", 1.0), member("b", 1.0), member("c", 1.0)];
        let mut b = [member("c", 1.0), member("a", 1.0), member("b", 1.0)];
        b[0].address = "10.9.9.9:1".into();
        for c in 0..1_000u64 {
            let x: Vec<&str> = owners(&a, c).iter().map(|m| m.id.as_str()).collect();
            let y: Vec<&str> = owners(&b, c).iter().map(|m| m.id.as_str()).collect();
            assert_eq!(x, y);
        }
    }
}
