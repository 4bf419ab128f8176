//! Odd subjects (braces, spaces, newlines, non-UTF-8 header bytes, 1 MB)
//! become safe storage keys: hashed, never colliding with another
//! subject's key, and never breaking the Cluster hash tag: every policy key
//! of one subject lands in one slot, checked with `CLUSTER KEYSLOT` on the
//! real Cluster. The same subjects behave identically in memory and Redis.
//! (The Redis helper's `redis_bad_input` covers a fixed list per
//! algorithm; these add random subjects, adversarial pairs, the layer's
//! keys and the memory store.)

use std::collections::HashSet;

use portcullis_core::subject::{encode_subject, hash_subject};
use portcullis_core::{MemoryStore, Policy, Store};
use portcullis_redis::RedisStore;
use portcullis_tests::reliability::{admin, command, crc16_slot, Rng};
use proptest::prelude::*;

fn policies() -> [Policy; 2] {
    [
        Policy::per_minute(2).name("short").build().unwrap(),
        Policy::per_day(3).name("long").build().unwrap(),
    ]
}

/// Subjects chosen to collide if encoding were careless: a subject and the
/// hash form of another, plain vs hashed neighbours at the length limit,
/// braces that would move the hash tag, separators, case.
fn adversarial_subjects() -> Vec<String> {
    let hashed_abc = hash_subject(b"abc");
    vec![
        "abc".to_owned(),
        hashed_abc.clone(),
        hashed_abc.to_uppercase(),
        hashed_abc[1..].to_owned(),
        hash_subject(hashed_abc.as_bytes()),
        "ABC".to_owned(),
        "x".repeat(128),
        "x".repeat(129),
        "{".to_owned(),
        "}".to_owned(),
        "{}".to_owned(),
        "}{".to_owned(),
        "{abc}".to_owned(),
        "a{b}c".to_owned(),
        "abc}".to_owned(),
        " abc".to_owned(),
        "abc ".to_owned(),
        "a b".to_owned(),
        "a\nb".to_owned(),
        "a\r\nb".to_owned(),
        "a\tb".to_owned(),
        "a\0b".to_owned(),
        String::new(),
        " ".to_owned(),
        "\n".to_owned(),
        "a,b".to_owned(),
        "a:b".to_owned(),
        "é".to_owned(),
        "e\u{301}".to_owned(),
        "{".repeat(1 << 20),
        "}".repeat(1 << 20),
        format!("{}{{", "z".repeat(1 << 20)),
        format!("{}{{", "z".repeat((1 << 20) - 1)),
    ]
}

/// Every subject starts with full capacity (no collision with any earlier
/// one), reaches its own limit, and the store answers the same as memory.
async fn each_subject_is_separate<S: Store>(
    label: &str,
    store: &S,
    reference: &MemoryStore,
    subjects: &[String],
) {
    let policies = policies();
    for subject in subjects {
        let short: String = subject.chars().take(24).collect();
        let short = format!("{label}: {short:?}");
        for attempt in 0..3 {
            let got = store.check(subject, &policies, 1).await.unwrap();
            let want = reference.check(subject, &policies, 1).await.unwrap();
            assert_eq!(
                got.is_allowed(),
                attempt < 2,
                "{short} attempt {attempt}: a fresh subject with its own limit"
            );
            assert_eq!(
                got.is_allowed(),
                want.is_allowed(),
                "{short}: same decision as memory"
            );
            assert_eq!(
                got.decisions()
                    .iter()
                    .map(|d| d.remaining())
                    .collect::<Vec<_>>(),
                want.decisions()
                    .iter()
                    .map(|d| d.remaining())
                    .collect::<Vec<_>>(),
                "{short}: same remaining as memory"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn adversarial_subjects_never_collide_memory_and_standalone() {
    let subjects = adversarial_subjects();
    let distinct: HashSet<&String> = subjects.iter().collect();
    assert_eq!(
        distinct.len(),
        subjects.len(),
        "the list holds no duplicates"
    );
    let memory = MemoryStore::new();
    each_subject_is_separate("memory", &memory, &MemoryStore::new(), &subjects).await;
    let redis = RedisStore::builder()
        .url(portcullis_tests::redis_url())
        .prefix(portcullis_tests::unique_prefix("sec-standalone"))
        .timeout(std::time::Duration::from_secs(5))
        .build()
        .await
        .unwrap();
    each_subject_is_separate("standalone", &redis, &MemoryStore::new(), &subjects).await;

    // What reached Redis: one key per subject and policy, each
    // `<prefix>:{<plain or #sha256>}:<policy>`, bounded.
    let mut connection = admin(&portcullis_tests::redis_url()).await;
    let pattern = format!("{}:*", redis.prefix());
    let keys: Vec<String> = command(&mut connection, &["KEYS", &pattern]).await.unwrap();
    assert_eq!(
        keys.len(),
        subjects.len() * 2,
        "one key per subject and policy"
    );
    let mut tags = HashSet::new();
    for key in &keys {
        assert!(key.len() < 200, "bounded key: {} bytes", key.len());
        let rest = key.strip_prefix(&format!("{}:{{", redis.prefix())).unwrap();
        let (tag, policy) = rest.split_once("}:").unwrap();
        assert!(policy == "short" || policy == "long");
        assert!(!tag.contains(['{', '}', ' ', '\n', '\r', '\0']), "{tag:?}");
        tags.insert(tag.to_owned());
    }
    assert_eq!(tags.len(), subjects.len(), "one hash tag per subject");
    for subject in &subjects {
        redis.reset(subject, &policies()).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn random_subjects_keep_one_slot_per_subject_on_the_cluster() {
    let urls = portcullis_tests::cluster_urls();
    let store = RedisStore::builder()
        .cluster(urls.clone())
        .prefix(portcullis_tests::unique_prefix("sec-cluster"))
        .timeout(std::time::Duration::from_secs(5))
        .build()
        .await
        .unwrap();
    let mut rng = Rng::new(0xc105);
    let mut subjects = adversarial_subjects();
    for _ in 0..150 {
        let len = rng.below(40) as usize;
        let bytes: Vec<u8> = (0..len)
            .map(|_| b"ab{}{}: \n\t,#\xc3\xa9xyz"[rng.below(17) as usize])
            .collect();
        subjects.push(String::from_utf8_lossy(&bytes).into_owned());
    }
    subjects.sort();
    subjects.dedup();
    // Multi-policy checks work for every subject (no CROSSSLOT), and the
    // subjects are separate there too.
    each_subject_is_separate("cluster", &store, &MemoryStore::new(), &subjects).await;
    let mut connection = admin(&urls[0]).await;
    for subject in &subjects {
        let encoded = encode_subject(subject, false);
        let tag_slot: u16 = command(&mut connection, &["CLUSTER", "KEYSLOT", &encoded])
            .await
            .unwrap();
        for policy in ["short", "long", "a-third-policy"] {
            let key = store.key_for(subject, policy);
            let slot: u16 = command(&mut connection, &["CLUSTER", "KEYSLOT", &key])
                .await
                .unwrap();
            assert_eq!(
                slot, tag_slot,
                "{key:?}: every policy key of a subject is in its tag's slot"
            );
            assert_eq!(slot, crc16_slot(key.as_bytes()));
        }
    }
    for subject in &subjects {
        store.reset(subject, &policies()).await.unwrap();
    }
}

/// A store for `key_for` (built with `lazy_connect`, so no server is needed),
/// with the runtime it was built in.
fn key_store() -> &'static (tokio::runtime::Runtime, RedisStore) {
    static STORE: std::sync::OnceLock<(tokio::runtime::Runtime, RedisStore)> =
        std::sync::OnceLock::new();
    STORE.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let store = runtime
            .block_on(
                RedisStore::builder()
                    .url("redis://127.0.0.1:1")
                    .lazy_connect(true)
                    .build(),
            )
            .unwrap();
        (runtime, store)
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3_000, ..ProptestConfig::default() })]

    /// Different subjects never share an encoded subject, whatever bytes
    /// they hold (plain, hashed, or one that looks like another's hash).
    #[test]
    fn encoding_is_injective(a in any::<String>(), b in any::<String>(), secret in any::<bool>()) {
        prop_assume!(a != b);
        prop_assert_ne!(encode_subject(&a, secret), encode_subject(&b, secret));
        let hashed_a = hash_subject(a.as_bytes());
        prop_assert_ne!(encode_subject(&hashed_a, false), encode_subject(&a, false));
    }

    /// Whatever the subject, the key has exactly one hash tag, the encoded
    /// subject, so all its policy keys share the tag's slot.
    #[test]
    fn keys_keep_one_hash_tag(subject in any::<String>(), p1 in "[a-z0-9_.-]{1,16}", p2 in "[a-z0-9_.-]{1,16}") {
        let store = &key_store().1;
        let encoded = encode_subject(&subject, false);
        let key = store.key_for(&subject, &p1);
        prop_assert_eq!(key.matches('{').count(), 1);
        prop_assert_eq!(key.matches('}').count(), 1);
        prop_assert_eq!(crc16_slot(key.as_bytes()), crc16_slot(encoded.as_bytes()));
        prop_assert_eq!(crc16_slot(key.as_bytes()), crc16_slot(store.key_for(&subject, &p2).as_bytes()));
    }
}
