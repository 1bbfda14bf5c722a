//! Fills (`Request::Fill`, what `memarts warmup` sends): each object is brought into the cache by
//! the slot its first read goes to, as that read would (one GET for a cold object's metadata and
//! chunk 0), and only its metadata comes back; a missing or malformed object fails alone; malformed
//! requests get a typed error and leave the proxy serving.

use memarts_protocol::{ErrorCode, FillRequest, Request, Response, MAX_FILL_URLS};
use memarts_shim::Error;

use crate::common::raw::{call, welcomed};
use crate::common::{moto, pattern, Fleet};

const CS: u64 = 64 << 10;

#[test]
fn a_fill_caches_each_objects_first_chunk_and_answers_only_its_metadata() {
    let bucket = moto().bucket("fill");
    let sizes = [1u64, 1000, CS - 1, CS, 3 * CS + 5, 70_000, 200_000];
    let objects: Vec<(String, Vec<u8>)> = sizes
        .iter()
        .enumerate()
        .map(|(i, &size)| {
            let data = pattern(4100 + i as u64, size as usize);
            moto().put(&bucket, &format!("f/{i}"), &data);
            (format!("s3://{bucket}/f/{i}"), data)
        })
        .collect();
    let fleet = Fleet::start(3, &[]);
    let client = fleet.client(CS);
    let missing = format!("s3://{bucket}/f/missing");
    let mut urls: Vec<&str> = objects.iter().map(|(u, _)| u.as_str()).collect();
    urls.insert(2, &missing);
    urls.push("gopher://nowhere/x");
    let filled: Vec<_> = urls.iter().map(|u| client.fill_head(u)).collect();
    assert_eq!(filled.len(), urls.len());
    assert!(matches!(&filled[2], Err(Error::NotFound(_))), "a missing object: {:?}", filled[2]);
    assert!(matches!(filled.last(), Some(Err(Error::BadRequest(_)))), "a bad URL: {:?}", filled.last());
    let metas: Vec<_> = filled.into_iter().filter_map(Result::ok).collect();
    assert_eq!(metas.iter().map(|m| m.size).collect::<Vec<_>>(), sizes, "the metadata, in order");
    assert!(metas.iter().all(|m| m.etag.as_deref().is_some_and(|e| !e.is_empty())));
    // One GET per object (its metadata and chunk 0 together), and one for the missing one.
    assert_eq!(moto().gets_settled(&bucket), sizes.len() + 1);
    // Chunk 0 of each is cached: reading them fetches only the chunks after it.
    for (url, want) in &objects {
        assert!(client.read(url).unwrap() == *want, "{url} differs");
    }
    let rest: u64 = sizes.iter().map(|s| s.div_ceil(CS).saturating_sub(1)).sum();
    assert_eq!(moto().gets_settled(&bucket) as u64, sizes.len() as u64 + 1 + rest);
    // Filling what is cached asks the origin nothing.
    let again: Vec<_> = urls[..2].iter().map(|u| client.fill_head(u)).collect();
    assert!(again.iter().all(Result::is_ok), "{again:?}");
    assert_eq!(moto().gets_settled(&bucket) as u64, sizes.len() as u64 + 1 + rest);
}

#[test]
fn malformed_fills_get_a_typed_error_and_the_proxy_keeps_serving() {
    let bucket = moto().bucket("fill-bad");
    let want = pattern(4200, 5000);
    moto().put(&bucket, "o", &want);
    let fleet = Fleet::start(1, &[]);
    let mut s = welcomed(&fleet.run_dir.join("proxy-0.sock"));
    let mut call = |req: &Request| call(&mut s, req);
    let fill = |urls: Vec<String>, chunk_size: u64| Request::Fill(FillRequest { urls, chunk_size });
    let too_many = (0..=MAX_FILL_URLS).map(|i| format!("s3://{bucket}/k{i}")).collect();
    match call(&fill(too_many, CS)) {
        Some(Response::Error(e)) => assert_eq!(e.code, ErrorCode::BadRequest, "{e}"),
        other => panic!("too many URLs: expected a typed BadRequest, got {other:?}"),
    }
    // A bad chunk size fails each object, with the reason.
    match call(&fill(vec![format!("s3://{bucket}/o")], 1)) {
        Some(Response::Filled(r)) => {
            assert!(matches!(&r[..], [Err(e)] if e.code == ErrorCode::BadRequest), "{r:?}")
        }
        other => panic!("a bad chunk size: expected Filled with a BadRequest, got {other:?}"),
    }
    // The connection is still in step, and an empty fill is an empty answer.
    assert!(matches!(call(&fill(Vec::new(), CS)), Some(Response::Filled(r)) if r.is_empty()));
    assert_eq!(moto().gets_settled(&bucket), 0, "nothing refused reached the origin");
    assert!(fleet.client(CS).read(&format!("s3://{bucket}/o")).unwrap() == want, "the proxy stays up");
}
