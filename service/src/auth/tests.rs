use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::routing::get;
use axum::Router;

use prometheus_client::registry::Registry;

use super::http::{guard, HttpAuth, Need, RefusalMetrics};
use super::*;

fn keys() -> (Signer, Verifier) {
    let (private, public) = generate_key_pair();
    assert!(private.starts_with("-----BEGIN PRIVATE KEY-----"), "{private}");
    assert!(public.starts_with("-----BEGIN PUBLIC KEY-----"), "{public}");
    (Signer::from_pem(private.as_bytes(), "test").unwrap(), Verifier::from_pem(public.as_bytes(), "test").unwrap())
}

const T1: TenantId = TenantId([1; 16]);
const T2: TenantId = TenantId([2; 16]);

#[test]
fn tokens_verify_with_their_claims_and_scopes_allow_what_they_should() {
    let (signer, verifier) = keys();
    for claims in [
        Claims::new(Scope::Management, None, None),
        Claims::new(Scope::Controller, None, None),
        Claims::new(Scope::Service, None, None),
        Claims::new(Scope::Tenant, Some(T1), Some(Duration::from_secs(3600))),
    ] {
        let token = signer.sign(&claims);
        assert!(token.len() < MAX_TOKEN_LEN, "{}", token.len());
        assert_eq!(verifier.verify(&token).unwrap(), claims);
    }
    let management = Claims::new(Scope::Management, None, None);
    let service = Claims::new(Scope::Service, None, None);
    let tenant = Claims::new(Scope::Tenant, Some(T1), None);
    for need in [Access::Management, Access::Service, Access::Tenant(T1), Access::Tenant(T2)] {
        assert_eq!(management.permits(need), Ok(()), "{need:?}");
    }
    assert_eq!(service.permits(Access::Service), Ok(()));
    assert_eq!(service.permits(Access::Tenant(T2)), Ok(()));
    assert_eq!(
        service.permits(Access::Management),
        Err(Refusal::Scope { have: Scope::Service, need: Scope::Management })
    );
    // Placing tenants: a controller or management, not a service or a tenant.
    let controller = Claims::new(Scope::Controller, None, None);
    for need in [Access::Placement, Access::Service, Access::Tenant(T2)] {
        assert_eq!(controller.permits(need), Ok(()), "{need:?}");
    }
    assert_eq!(
        controller.permits(Access::Management),
        Err(Refusal::Scope { have: Scope::Controller, need: Scope::Management })
    );
    assert_eq!(management.permits(Access::Placement), Ok(()));
    for (have, claims) in [(Scope::Service, &service), (Scope::Tenant, &tenant)] {
        assert_eq!(claims.permits(Access::Placement), Err(Refusal::Scope { have, need: Scope::Controller }));
    }
    assert_eq!(tenant.permits(Access::Tenant(T1)), Ok(()));
    assert_eq!(tenant.permits(Access::Tenant(T2)), Err(Refusal::OtherTenant));
    assert_eq!(tenant.permits(Access::Service), Err(Refusal::Scope { have: Scope::Tenant, need: Scope::Service }));
    assert_eq!(
        tenant.permits(Access::Management),
        Err(Refusal::Scope { have: Scope::Tenant, need: Scope::Management })
    );
}

#[test]
fn a_token_bound_to_a_timeline_reads_only_it_and_a_read_only_one_never_proposes() {
    let (signer, verifier) = keys();
    let (l1, l2) = (TimelineId([1; 16]), TimelineId([2; 16]));
    let writer = Claims::new(Scope::Tenant, Some(T1), None).for_timeline(l1);
    let reader = Claims::new(Scope::Tenant, Some(T1), None).for_timeline(l1).reading_only();
    let whole = Claims::new(Scope::Tenant, Some(T1), None);
    for claims in [&writer, &reader] {
        // Signed and verified with what binds them.
        assert_eq!(&verifier.verify(&signer.sign(claims)).unwrap(), claims);
        assert_eq!(claims.permits(Access::Timeline(T1, l1)), Ok(()));
        assert_eq!(claims.permits(Access::Tenant(T1)), Ok(()), "where its tenant is attached");
        assert_eq!(claims.permits(Access::Timeline(T1, l2)), Err(Refusal::OtherTimeline));
        assert_eq!(claims.permits(Access::Propose(T1, l2)), Err(Refusal::OtherTimeline));
        assert_eq!(claims.permits(Access::Timeline(T2, l1)), Err(Refusal::OtherTenant));
    }
    assert_eq!(writer.permits(Access::Propose(T1, l1)), Ok(()));
    assert_eq!(reader.permits(Access::Propose(T1, l1)), Err(Refusal::ReadOnly));
    assert!(!Refusal::ReadOnly.unauthenticated() && !Refusal::OtherTimeline.unauthenticated());
    // A token for the whole tenant reads and proposes on any of its timelines.
    for l in [l1, l2] {
        assert_eq!(whole.permits(Access::Timeline(T1, l)), Ok(()));
        assert_eq!(whole.permits(Access::Propose(T1, l)), Ok(()));
    }
    // The services read every timeline but propose on none; management does both.
    let service = Claims::new(Scope::Service, None, None);
    assert_eq!(service.permits(Access::Timeline(T2, l2)), Ok(()));
    assert_eq!(
        service.permits(Access::Propose(T1, l1)),
        Err(Refusal::Scope { have: Scope::Service, need: Scope::Tenant })
    );
    assert_eq!(Claims::new(Scope::Management, None, None).permits(Access::Propose(T1, l1)), Ok(()));
    // Only a tenant token may be bound: anything else is malformed.
    for claims in [service.clone().for_timeline(l1), service.reading_only()] {
        let token =
            jsonwebtoken::encode(&jsonwebtoken::Header::new(jsonwebtoken::Algorithm::EdDSA), &claims, &signer.key);
        assert!(matches!(verifier.verify(&token.unwrap()), Err(Refusal::Malformed(_))), "{claims:?}");
    }
}

#[test]
fn bad_tokens_are_refused_with_their_reason() {
    let (signer, verifier) = keys();
    let (other, _) = keys();
    let claims = Claims::new(Scope::Management, None, None);
    assert_eq!(verifier.verify(""), Err(Refusal::NoToken));
    // Another key's token names a key this verifier does not trust.
    assert_eq!(verifier.verify(&other.sign(&claims)), Err(Refusal::UnknownKey));
    // A flipped character of the signature.
    let mut token = signer.sign(&claims).into_bytes();
    let last = token.len() - 2;
    token[last] = if token[last] == b'A' { b'B' } else { b'A' };
    assert_eq!(verifier.verify(std::str::from_utf8(&token).unwrap()), Err(Refusal::BadSignature));
    // Expired beyond the leeway; still valid within it.
    let mut old = claims.clone();
    old.exp = Some(old.iat - 3600);
    assert_eq!(verifier.verify(&signer.sign(&old)), Err(Refusal::Expired));
    old.exp = Some(old.iat - 5);
    assert!(verifier.verify(&signer.sign(&old)).is_ok());
    for garbage in ["x", "a.b.c", "...."] {
        assert!(matches!(verifier.verify(garbage), Err(Refusal::Malformed(_))), "{garbage}");
    }
    // Well-formed but with a signature of nothing.
    assert_eq!(verifier.verify("eyJhbGciOiJFZERTQSJ9.e30.AAAA"), Err(Refusal::BadSignature));
    assert!(matches!(verifier.verify(&"a".repeat(MAX_TOKEN_LEN + 1)), Err(Refusal::Malformed(_))));
    // Another algorithm (a shared-secret token) is not accepted.
    let hs = jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(b"secret"),
    )
    .unwrap();
    assert!(matches!(verifier.verify(&hs), Err(Refusal::Malformed(_))));
    // Claims that contradict their scope.
    let raw =
        |value: serde_json::Value| jsonwebtoken::encode(&Header::new(Algorithm::EdDSA), &value, &signer.key).unwrap();
    for value in [
        serde_json::json!({"scope": "tenant", "iat": 1}),
        serde_json::json!({"scope": "service", "tenant_id": T1.to_string(), "iat": 1}),
        serde_json::json!({"scope": "root", "iat": 1}),
        serde_json::json!({"scope": "management"}),
        serde_json::json!({"scope": "management", "iat": 1, "exp": "soon"}),
    ] {
        assert!(matches!(verifier.verify(&raw(value.clone())), Err(Refusal::Malformed(_))), "{value}");
    }
}

#[test]
fn key_files_and_token_files_load_and_bad_ones_say_which() {
    let dir = std::env::temp_dir().join(format!("strata-auth-keys-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (private, public) = generate_key_pair();
    write_secret(&dir.join("private.pem"), &private).unwrap();
    std::fs::write(dir.join("public.pem"), &public).unwrap();
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(dir.join("private.pem")).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    let signer = Signer::load(&dir.join("private.pem")).unwrap();
    let token = signer.sign(&Claims::new(Scope::Service, None, None));
    write_secret(&dir.join("token"), &format!("{token}\n")).unwrap();
    let config =
        AuthConfig { public_key: dir.join("public.pem"), token_file: Some(dir.join("token")), audit_log: None };
    let secret = config.token().unwrap().unwrap();
    assert_eq!(&*secret.expose(), token);
    assert_eq!(format!("{secret:?}"), "Token(..)");
    assert_eq!(config.verifier().unwrap().verify(&token).unwrap().scope, Scope::Service);
    // The wrong kind of key in each place, and missing files.
    let err = Verifier::load(&dir.join("private.pem")).err().unwrap().to_string();
    assert!(err.contains("private.pem") && err.contains("public"), "{err}");
    let err = Signer::load(&dir.join("public.pem")).err().unwrap().to_string();
    assert!(err.contains("public.pem") && err.contains("private"), "{err}");
    assert!(Verifier::load(&dir.join("missing")).err().unwrap().to_string().contains("missing"));
    std::fs::write(dir.join("token"), "two tokens").unwrap();
    let err = config.token().unwrap_err().to_string();
    assert!(err.contains("token") && !err.contains("two"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

async fn call(router: &Router, path: &str, token: Option<&str>) -> (u16, String) {
    use tower_service::Service;
    let mut req = Request::builder().uri(path);
    if let Some(t) = token {
        req = req.header("Authorization", format!("Bearer {t}"));
    }
    let response = match router.clone().call(req.body(Body::empty()).unwrap()).await {
        Ok(r) => r,
        Err(never) => match never {},
    };
    let status = response.status().as_u16();
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 16).await.unwrap();
    (status, String::from_utf8(bytes.to_vec()).unwrap())
}

#[tokio::test]
async fn http_routes_answer_401_or_403_before_their_handler_runs() {
    let (signer, verifier) = keys();
    let mut registry = Registry::default();
    let refusals = RefusalMetrics::register(&mut registry);
    let auth = HttpAuth::new(std::sync::Arc::new(verifier), refusals);
    let ran = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let handler = |ran: std::sync::Arc<std::sync::atomic::AtomicUsize>| {
        get(move || async move {
            ran.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            "done"
        })
    };
    let router = Router::new()
        .merge(guard(Router::new().route("/admin", handler(ran.clone())), Some(&auth), Need::Management))
        .merge(guard(Router::new().route("/status", handler(ran.clone())), Some(&auth), Need::Service))
        .merge(guard(Router::new().route("/t/{tenant}/x", handler(ran.clone())), Some(&auth), Need::Tenant));
    let token = |scope, tenant| signer.sign(&Claims::new(scope, tenant, None));
    let (management, service, tenant1) =
        (token(Scope::Management, None), token(Scope::Service, None), token(Scope::Tenant, Some(T1)));
    let (t1, t2) = (format!("/t/{T1}/x"), format!("/t/{T2}/x"));
    // A shard's route is its tenant's.
    let (s1, s2) = (format!("/t/{T1}-1of4/x"), format!("/t/{T2}-0of2/x"));
    let cases: Vec<(&str, Option<&str>, u16)> = vec![
        ("/admin", None, 401),
        ("/admin", Some("garbage"), 401),
        ("/admin", Some(&service), 403),
        ("/admin", Some(&tenant1), 403),
        ("/admin", Some(&management), 200),
        ("/status", Some(&tenant1), 403),
        ("/status", Some(&service), 200),
        (&t1, None, 401),
        (&t1, Some(&tenant1), 200),
        (&t2, Some(&tenant1), 403),
        (&t2, Some(&service), 200),
        (&s1, Some(&tenant1), 200),
        (&s2, Some(&tenant1), 403),
        ("/t/not-a-tenant/x", Some(&tenant1), 403),
        ("/t/not-a-tenant/x", Some(&management), 200),
    ];
    let mut allowed = 0;
    for (path, token, want) in cases {
        let (status, body) = call(&router, path, token).await;
        assert_eq!(status, want, "{path} with {token:?}: {body}");
        if want == 200 {
            allowed += 1;
        } else {
            assert!(body.contains("\"error\""), "{body}");
            if let Some(t) = token {
                assert!(!body.contains(t), "the token is echoed: {body}");
            }
        }
    }
    assert_eq!(ran.load(std::sync::atomic::Ordering::SeqCst), allowed, "only allowed calls reach a handler");
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert!(text.contains(r#"auth_refusals_total{interface="http",reason="no_token"} 2"#), "{text}");
    assert!(text.contains(r#"auth_refusals_total{interface="http",reason="scope"} 4"#), "{text}");
    assert!(text.contains(r#"auth_refusals_total{interface="http",reason="other_tenant"} 2"#), "{text}");
}

/// The committed vectors of `docs/security.md`: a key pair made for them
/// (used nowhere else) and tokens it signed. Ed25519 signatures are
/// deterministic, so signing the same claims must give the same bytes.
/// The first two are of format 1 (no key id, no token id), still accepted.
#[test]
fn committed_token_vectors_verify_and_are_reproduced_exactly() {
    let signer = Signer::from_pem(include_bytes!("../../tests/data/auth/private.pem"), "vector").unwrap();
    let verifier = Verifier::from_pem(include_bytes!("../../tests/data/auth/public.pem"), "vector").unwrap();
    let tenant = "0123456789abcdef0123456789abcdef".parse::<TenantId>().unwrap();
    let cases = [
        (include_str!("../../tests/data/auth/management.token"), Scope::Management, None),
        (include_str!("../../tests/data/auth/tenant.token"), Scope::Tenant, Some(tenant)),
    ];
    for (text, scope, tenant_id) in cases {
        let token = text.trim();
        assert_eq!(jsonwebtoken::decode_header(token).unwrap().kid, None);
        let claims = verifier.verify(token).unwrap();
        assert_eq!((claims.scope, claims.tenant_id, claims.exp, claims.jti.as_deref()), (scope, tenant_id, None, None));
        assert_eq!(claims.iat, 1_795_829_316);
        let legacy = jsonwebtoken::encode(&Header::new(Algorithm::EdDSA), &claims, &signer.key).unwrap();
        assert_eq!(legacy, token);
    }
    // Format 3: the key id in the header, a token id, bound to a timeline, read-only.
    let expected = Claims {
        scope: Scope::Tenant,
        tenant_id: Some(tenant),
        timeline_id: Some("fedcba9876543210fedcba9876543210".parse().unwrap()),
        read_only: true,
        iat: 1_795_829_316,
        exp: Some(1_795_832_916),
        jti: Some("00112233445566778899aabbccddeeff".into()),
    };
    if std::env::var_os("STRATA_WRITE_VECTORS").is_some() {
        let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap();
        std::fs::write(format!("{dir}/tests/data/auth/replica-v3.token"), signer.sign(&expected) + "\n").unwrap();
        return;
    }
    let token = include_str!("../../tests/data/auth/replica-v3.token").trim();
    assert_eq!(jsonwebtoken::decode_header(token).unwrap().kid.as_deref(), Some(signer.key_id()));
    assert_eq!(signer.key_id(), verifier.key_ids()[0]);
    let mut open = Validation::new(Algorithm::EdDSA);
    open.validate_exp = false;
    open.required_spec_claims.clear();
    let key = DecodingKey::from_ed_pem(include_bytes!("../../tests/data/auth/public.pem")).unwrap();
    assert_eq!(jsonwebtoken::decode::<Claims>(token, &key, &open).unwrap().claims, expected);
    // Expired long ago, as a committed token should be.
    assert_eq!(verifier.verify(token), Err(Refusal::Expired));
    assert_eq!(signer.sign(&expected), token);
}

#[test]
fn passwords_are_long_random_and_plain() {
    let a = generate_password();
    assert_eq!(a.len(), 32);
    assert!(a.bytes().all(|c| c.is_ascii_alphanumeric()), "{a}");
    assert_ne!(a, generate_password());
}

/// `path` with `text`, its permission bits set to `mode` whatever the umask.
fn file_with_mode(path: &std::path::Path, text: &str, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

#[test]
fn a_token_file_others_can_read_is_refused_naming_it_and_its_mode() {
    let dir = std::env::temp_dir().join(format!("strata-auth-modes-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (signer, _) = keys();
    let token = signer.sign(&Claims::new(Scope::Service, None, None));
    let path = dir.join("service.token");
    for mode in [0o600, 0o400] {
        file_with_mode(&path, &token, mode);
        assert_eq!(&*read_token(&path).unwrap().expose(), token, "mode {mode:o}");
    }
    for mode in [0o644, 0o640, 0o604, 0o620, 0o601] {
        file_with_mode(&path, &token, mode);
        let err = read_token(&path).unwrap_err();
        let KeyError::Io { source, .. } = &err else { panic!("{err}") };
        let exposed = source.get_ref().and_then(|e| e.downcast_ref::<Exposed>()).expect("an Exposed");
        assert_eq!((exposed.path.as_path(), exposed.mode), (path.as_path(), mode));
        let text = err.to_string();
        let name = path.display().to_string();
        assert!(text.starts_with(&format!("{name}: mode 0{mode:o} ")), "{text}");
        assert!(text.ends_with(&format!("chmod 600 {name}")), "{text}");
        assert!(!text.contains(&token), "{text}");
        // Through a service's config too.
        let config = AuthConfig { public_key: dir.join("public.pem"), token_file: Some(path.clone()), audit_log: None };
        assert!(config.token().unwrap_err().to_string().contains("chmod 600"));
    }
    // A missing file is the system's error, not a refusal of its mode.
    let err = read_private(&dir.join("missing")).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::NotFound);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Waits (polling, at most 10 s) until `done` holds; the verifiers and
/// token watchers look at their files once a second.
fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(std::time::Instant::now() < deadline, "never: {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn tokens_name_their_key_and_every_key_of_the_file_is_trusted() {
    let (new_private, new_public) = generate_key_pair();
    let (old_private, old_public) = generate_key_pair();
    let (new, old) = (
        Signer::from_pem(new_private.as_bytes(), "new").unwrap(),
        Signer::from_pem(old_private.as_bytes(), "old").unwrap(),
    );
    let both = Verifier::from_pem(format!("{new_public}{old_public}").as_bytes(), "both").unwrap();
    assert_eq!(both.key_ids(), vec![new.key_id().to_string(), old.key_id().to_string()]);
    assert_eq!(new.key_id().len(), 16);
    assert_eq!(keys::public_of(&new_private).unwrap(), new_public);
    for signer in [&new, &old] {
        let token = signer.sign(&Claims::new(Scope::Service, None, None));
        assert_eq!(jsonwebtoken::decode_header(&token).unwrap().kid.as_deref(), Some(signer.key_id()));
        assert_eq!(both.verify(&token).unwrap().scope, Scope::Service);
    }
    // Only the new key: the old one's tokens name a key no longer trusted.
    let only_new = Verifier::from_pem(new_public.as_bytes(), "new").unwrap();
    assert_eq!(only_new.verify(&old.sign(&Claims::new(Scope::Service, None, None))), Err(Refusal::UnknownKey));
    // A token without a key id (from before them) is tried against each key.
    let legacy =
        jsonwebtoken::encode(&Header::new(Algorithm::EdDSA), &Claims::new(Scope::Service, None, None), &old.key)
            .unwrap();
    assert!(both.verify(&legacy).is_ok());
    assert_eq!(only_new.verify(&legacy), Err(Refusal::BadSignature));
    // A key id that names a trusted key but whose signature is another's.
    let header = Header { kid: Some(new.key_id().to_string()), ..Header::new(Algorithm::EdDSA) };
    let forged = jsonwebtoken::encode(&header, &Claims::new(Scope::Service, None, None), &old.key).unwrap();
    assert_eq!(both.verify(&forged), Err(Refusal::BadSignature));
    // Each token has an id of its own.
    let (a, b) = (Claims::new(Scope::Service, None, None), Claims::new(Scope::Service, None, None));
    assert_ne!(a.jti, b.jti);
    assert!(revoked::check_jti(a.jti.as_deref().unwrap()).is_ok());
    // Key files: not a key, a private key, the same key twice, too many keys.
    for (bad, what) in [
        ("nothing".to_string(), "no PEM"),
        (new_private.clone(), "not an Ed25519 PUBLIC KEY"),
        (format!("{new_public}{new_public}"), "twice"),
        (new_public.repeat(crate::limits::MAX_TRUSTED_KEYS + 1), "at most"),
    ] {
        let err = Verifier::from_pem(bad.as_bytes(), "file").err().unwrap().to_string();
        assert!(err.contains(what), "{err}");
    }
}

#[test]
fn a_verifier_follows_its_key_file_and_deny_list_without_a_restart() {
    let dir = std::env::temp_dir().join(format!("strata-auth-follow-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (a_private, a_public) = generate_key_pair();
    let (b_private, b_public) = generate_key_pair();
    let (a, b) =
        (Signer::from_pem(a_private.as_bytes(), "a").unwrap(), Signer::from_pem(b_private.as_bytes(), "b").unwrap());
    let key_file = dir.join("public.pem");
    let write = |path: &std::path::Path, text: &str| crate::durable::replace_file(path, text.as_bytes(), true).unwrap();
    write(&key_file, &a_public);
    let verifier = Verifier::load(&key_file).unwrap();
    let (a_token, b_token) =
        (a.sign(&Claims::new(Scope::Service, None, None)), b.sign(&Claims::new(Scope::Service, None, None)));
    assert!(verifier.verify(&a_token).is_ok());
    assert_eq!(verifier.verify(&b_token), Err(Refusal::UnknownKey));
    // Rotation: the new key first, the old one still trusted; then the old retired.
    write(&key_file, &format!("{b_public}{a_public}"));
    eventually("the new key is trusted", || verifier.verify(&b_token).is_ok());
    assert!(verifier.verify(&a_token).is_ok());
    write(&key_file, &b_public);
    eventually("the old key is retired", || verifier.verify(&a_token) == Err(Refusal::UnknownKey));
    // A key file that turned bad keeps the keys read before.
    write(&key_file, "garbage");
    std::thread::sleep(crate::limits::AUTH_RELOAD_INTERVAL * 2);
    assert!(verifier.verify(&b_token).is_ok());
    // Revocation by the token's id, and only of that token.
    let other = b.sign(&Claims::new(Scope::Service, None, None));
    let jti = verifier.verify(&b_token).unwrap().jti.unwrap();
    let mut list = DenyList::default();
    list.revoke(&jti, None, now()).unwrap();
    let revoked_file = revoked_file(&key_file);
    write(&revoked_file, &list.to_json());
    eventually("the token is revoked", || verifier.verify(&b_token) == Err(Refusal::Revoked));
    assert!(verifier.verify(&other).is_ok());
    // A deny list that turned bad keeps the list read before.
    write(&revoked_file, "{");
    std::thread::sleep(crate::limits::AUTH_RELOAD_INTERVAL * 2);
    assert_eq!(verifier.verify(&b_token), Err(Refusal::Revoked));
    std::fs::remove_file(&revoked_file).unwrap();
    eventually("no deny list: nothing revoked", || verifier.verify(&b_token).is_ok());
    // A deny list that cannot be read refuses the start.
    write(&key_file, &b_public);
    write(&revoked_file, "{");
    let err = Verifier::load(&key_file).err().unwrap().to_string();
    assert!(err.contains("revoked.json"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_processs_own_token_follows_its_file() {
    let dir = std::env::temp_dir().join(format!("strata-auth-own-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (signer, _) = keys();
    let path = dir.join("service.token");
    let first = signer.sign(&Claims::new(Scope::Service, None, None));
    write_secret(&path, &first).unwrap();
    let token = load_token(&path).unwrap();
    let held_by_a_client = Some(token.clone());
    let second = signer.sign(&Claims::new(Scope::Service, None, None));
    write_secret(&path, &second).unwrap();
    eventually("the new token is every clone's", || {
        held_by_a_client.as_ref().map(|t| t.expose().to_string()) == Some(second.clone())
    });
    // A file that turned unreadable keeps the token.
    std::fs::write(&path, "two tokens").unwrap();
    std::thread::sleep(crate::limits::AUTH_RELOAD_INTERVAL * 2);
    assert_eq!(&*token.expose(), second);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn an_issuers_key_signs_only_renewed_tenant_tokens_that_expire_soon() {
    let dir = std::env::temp_dir().join(format!("strata-auth-issuer-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (cluster_private, cluster_public) = generate_key_pair();
    let (issuer_private, issuer_public) = generate_key_pair();
    let key_file = dir.join("public.pem");
    std::fs::write(&key_file, &cluster_public).unwrap();
    std::fs::write(issuer_public_file(&key_file), &issuer_public).unwrap();
    let verifier = Verifier::load(&key_file).unwrap();
    let (cluster, issuer) = (
        Signer::from_pem(cluster_private.as_bytes(), "cluster").unwrap(),
        Signer::from_pem(issuer_private.as_bytes(), "issuer").unwrap(),
    );
    assert_eq!(verifier.issuer_key_ids(), vec![issuer.key_id().to_string()]);
    assert!(verifier.is_newest(issuer.key_id()) && verifier.is_newest(cluster.key_id()));
    let agent = Claims::new(Scope::Tenant, Some(T1), Some(Duration::from_secs(3600)))
        .for_timeline(TimelineId([3; 16]))
        .reading_only();
    let renewed = agent.renewed(Duration::from_secs(3600));
    assert_eq!(
        (renewed.jti.as_ref(), renewed.timeline_id, renewed.read_only),
        (agent.jti.as_ref(), agent.timeline_id, true)
    );
    assert_eq!(verifier.verify(&issuer.sign(&renewed)).unwrap(), renewed);
    // Anything else it signs is refused: other scopes, no expiry, a long life.
    for claims in [
        Claims::new(Scope::Management, None, Some(Duration::from_secs(60))),
        Claims::new(Scope::Service, None, Some(Duration::from_secs(60))),
        Claims::new(Scope::Controller, None, Some(Duration::from_secs(60))),
        Claims::new(Scope::Tenant, Some(T1), None),
        agent.renewed(crate::limits::MAX_ISSUED_TTL + Duration::from_secs(1)),
    ] {
        let refusal = verifier.verify(&issuer.sign(&claims)).unwrap_err();
        assert!(matches!(&refusal, Refusal::Malformed(m) if m.contains("issuer")), "{claims:?}: {refusal:?}");
        // The cluster's key signs them all.
        assert!(verifier.verify(&cluster.sign(&claims)).is_ok(), "{claims:?}");
    }
    // Revoking a token revokes its renewals (they keep its id).
    let mut list = DenyList::default();
    list.revoke(agent.jti.as_deref().unwrap(), None, now()).unwrap();
    crate::durable::replace_file(&revoked_file(&key_file), list.to_json().as_bytes(), true).unwrap();
    eventually("the renewal is revoked with its token", || {
        verifier.verify(&issuer.sign(&renewed)) == Err(Refusal::Revoked)
    });
    // Without the issuers' file, its tokens name a key no one trusts.
    std::fs::remove_file(revoked_file(&key_file)).unwrap();
    std::fs::remove_file(issuer_public_file(&key_file)).unwrap();
    eventually("the issuer is no longer trusted", || {
        verifier.verify(&issuer.sign(&renewed)) == Err(Refusal::UnknownKey)
    });
    std::fs::remove_dir_all(&dir).unwrap();
}
