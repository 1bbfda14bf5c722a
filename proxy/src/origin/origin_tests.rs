//! Tests of `origin`.

use super::*;

/// An S3 endpoint nothing listens on: these tests never get as far as sending a request.
fn unreachable_s3() -> OriginConfig {
    OriginConfig {
        endpoint: Some("http://127.0.0.1:9".into()),
        allow_http: true,
        max_attempts: 1,
        ..OriginConfig::default()
    }
}

/// Found by the reliability campaign's fuzzer: a chunk request whose ETag held a control
/// character made object_store panic while signing the GET, killing the task serving the read.
#[tokio::test]
async fn an_etag_no_header_can_carry_is_a_bad_request_not_a_panic() {
    let origin = Origin::new(unreachable_s3(), Some(("id".into(), "secret".into(), None)));
    let url = ObjectUrl::parse("s3://b/k").unwrap();
    for etag in ["\"abc\n\"", "\"a\u{1}\"", "\"\u{7f}\""] {
        let err = origin.get_range(&url, 0..10, etag).await.unwrap_err();
        assert!(matches!(err, OriginError::BadRequest(_)), "{etag:?}: {err}");
    }
}

/// Found by the reliability campaign's fuzzer: a bucket name with a space or a control character
/// made object_store panic building the request (and `#`, `?` or `..` named another bucket).
#[tokio::test]
async fn a_bucket_name_a_url_cannot_carry_is_a_bad_request_not_a_panic() {
    let origin = Origin::new(unreachable_s3(), Some(("id".into(), "secret".into(), None)));
    for bucket in ["a b", "a\u{1}b", "a#b", "a?b", "a/b%", "ünï", "..", ".", "-a", "a."] {
        let url = ObjectUrl { kind: OriginKind::S3, bucket: bucket.into(), key: "k".into() };
        let err = origin.head(&url).await.unwrap_err();
        assert!(matches!(err, OriginError::BadRequest(_)), "{bucket:?}: {err}");
    }
}

/// Found by the reliability campaign's fuzzer: every new bucket name a client sent kept an S3
/// client (about 100 KiB and an idle connection) for the life of the proxy.
#[test]
fn bucket_clients_are_bounded_whatever_buckets_clients_name() {
    let origin = Origin::new(unreachable_s3(), None).with_bucket_capacity(4);
    for i in 0..12 {
        origin.store_for(&ObjectUrl::parse(&format!("s3://bucket-{i}/k")).unwrap()).unwrap();
    }
    assert_eq!(origin.bucket_clients(), 4);
    // The most recently used are kept.
    assert!(origin.buckets.lock().unwrap().contains("bucket-11"));
}
