//! Which objects are sealed: those of a tenant, named `tenants/<tenant>/…`
//! (the pageserver's layers, indexes and heatmaps) or `wal/<tenant>/…`
//! (offloaded WAL). Everything else (the controller's state and lease, the
//! key objects themselves) is stored as it is given.

use strata_protocol::{TenantId, TenantShardId};

/// The top-level prefixes of tenants' objects.
pub const TENANT_PREFIXES: [&str; 2] = ["tenants", "wal"];
/// The top-level prefix of the data key objects.
pub const KEYS_PREFIX: &str = "keys";

/// The tenant whose object `key` is: `None` for an object outside the
/// tenant prefixes, an error for a name under one whose second part is
/// not a tenant id (it would otherwise escape encryption).
pub fn object_tenant(key: &str) -> Option<Result<TenantId, String>> {
    let mut parts = key.splitn(3, '/');
    let top = parts.next()?;
    if !TENANT_PREFIXES.contains(&top) {
        return None;
    }
    let tenant = parts.next().unwrap_or("");
    // A shard's objects (`<tenant>-<n>of<count>`) are sealed with its
    // tenant's keys: every shard of a tenant shares them.
    let parsed = tenant.parse::<TenantShardId>().map(|t| t.tenant);
    Some(parsed.map_err(|_| format!("`{tenant}` under `{top}/` is not a tenant id")))
}

/// The object holding `tenant`'s wrapped data keys.
pub fn data_keys_key(tenant: TenantId) -> String {
    format!("{KEYS_PREFIX}/{tenant}/data-keys.json")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenant_objects_are_named_by_their_prefix() {
        let t = TenantId([0xab; 16]);
        assert_eq!(object_tenant(&format!("tenants/{t}/timelines/x/layer")), Some(Ok(t)));
        assert_eq!(object_tenant(&format!("tenants/{t}/heatmap-v1.json")), Some(Ok(t)));
        assert_eq!(object_tenant(&format!("tenants/{t}-1of4/timelines/x/layer")), Some(Ok(t)));
        assert!(matches!(object_tenant(&format!("tenants/{t}-4of4/x")), Some(Err(_))));
        assert_eq!(object_tenant(&format!("wal/{t}/l/000000010000000000000001")), Some(Ok(t)));
        for outside in ["controller/state.json", "keys/x/data-keys.json", "tenantsx/y", "copy", ""] {
            assert_eq!(object_tenant(outside), None, "{outside}");
        }
        for bad in ["tenants/t1/timelines/l1/layer", "wal", "tenants//x"] {
            assert!(object_tenant(bad).is_some_and(|r| r.is_err()), "{bad}");
        }
        assert_eq!(data_keys_key(t), format!("keys/{t}/data-keys.json"));
    }
}
