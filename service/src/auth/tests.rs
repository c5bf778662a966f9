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
    assert_eq!(verifier.verify(&other.sign(&claims)), Err(Refusal::BadSignature));
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
    let config = AuthConfig { public_key: dir.join("public.pem"), token_file: Some(dir.join("token")) };
    let secret = config.token().unwrap().unwrap();
    assert_eq!(secret.expose(), token);
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
    assert!(text.contains(r#"auth_refusals_total{interface="http",reason="other_tenant"} 1"#), "{text}");
}

/// The committed vectors of `docs/security.md`: a key pair made for them
/// (used nowhere else) and two tokens it signed. Ed25519 signatures are
/// deterministic, so signing the same claims must give the same bytes.
#[test]
fn committed_token_vectors_verify_and_are_reproduced_exactly() {
    let signer = Signer::from_pem(include_bytes!("../../tests/data/auth/private.pem"), "vector").unwrap();
    let verifier = Verifier::from_pem(include_bytes!("../../tests/data/auth/public.pem"), "vector").unwrap();
    let cases = [
        (include_str!("../../tests/data/auth/management.token"), Scope::Management, None),
        (
            include_str!("../../tests/data/auth/tenant.token"),
            Scope::Tenant,
            Some("0123456789abcdef0123456789abcdef".parse::<TenantId>().unwrap()),
        ),
    ];
    for (text, scope, tenant_id) in cases {
        let token = text.trim();
        let claims = verifier.verify(token).unwrap();
        assert_eq!((claims.scope, claims.tenant_id, claims.exp), (scope, tenant_id, None));
        assert_eq!(claims.iat, 1_795_829_316);
        assert_eq!(signer.sign(&claims), token);
    }
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
        assert_eq!(read_token(&path).unwrap().expose(), token, "mode {mode:o}");
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
        let config = AuthConfig { public_key: dir.join("public.pem"), token_file: Some(path.clone()) };
        assert!(config.token().unwrap_err().to_string().contains("chmod 600"));
    }
    // A missing file is the system's error, not a refusal of its mode.
    let err = read_private(&dir.join("missing")).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::NotFound);
    std::fs::remove_dir_all(&dir).unwrap();
}
