//! Installed agents: a name recorded once (a second install of it refused, eight concurrent
//! claims of one name won by one), listed by name, replaced by an upgrade, removed.

use super::*;
use acp_gateway::store::InstallRecord;

fn install(name: &str, version: &str, by: &str) -> InstallRecord {
    InstallRecord {
        name: name.to_owned(),
        registry_id: format!("{name}-acp"),
        kind: "binary".to_owned(),
        version: version.to_owned(),
        choice: format!(r#"{{"kind":"binary","version":"{version}","source":"http://h/ä.tgz"}}"#),
        sha256: Some("ab".repeat(32)),
        installed_at: 1_700_000_000_000_000,
        installed_by: by.to_owned(),
        auth_method: None,
        logged_out: false,
    }
}

pub async fn check_installs(store: Arc<dyn Store>) {
    assert!(store.installs().await.unwrap().is_empty());
    let (echo, zed) = (
        install("echo", "1.0.0", "r1"),
        install("zed", "0.1.0", "r1"),
    );
    assert!(store.add_install(&zed).await.unwrap());
    assert!(store.add_install(&echo).await.unwrap());
    // A name is installed once: a second install of it changes nothing.
    assert!(
        !store
            .add_install(&install("echo", "9.9.9", "r2"))
            .await
            .unwrap()
    );
    assert_eq!(
        store.installs().await.unwrap(),
        vec![echo.clone(), zed.clone()]
    );

    // An upgrade replaces the row; there is nothing to replace for a name never installed.
    let mut upgraded = install("echo", "2.0.0", "r2");
    upgraded.sha256 = None;
    assert!(store.replace_install(&upgraded).await.unwrap());
    assert!(
        !store
            .replace_install(&install("nobody", "1", "r1"))
            .await
            .unwrap()
    );
    assert_eq!(store.installs().await.unwrap(), vec![upgraded, zed.clone()]);

    // Signed in, then signed out.
    assert!(
        store
            .set_install_auth("zed", Some("api-key"))
            .await
            .unwrap()
    );
    assert_eq!(
        store.installs().await.unwrap()[1].auth_method.as_deref(),
        Some("api-key")
    );
    assert!(
        !store
            .set_install_auth("nobody", Some("api-key"))
            .await
            .unwrap()
    );
    assert!(!store.installs().await.unwrap()[1].logged_out);
    assert!(store.set_install_auth("zed", None).await.unwrap());
    let zed_now = &store.installs().await.unwrap()[1];
    assert_eq!(
        (zed_now.auth_method.as_deref(), zed_now.logged_out),
        (None, true)
    );
    // Signed in again: no longer logged out.
    assert!(
        store
            .set_install_auth("zed", Some("api-key"))
            .await
            .unwrap()
    );
    assert!(!store.installs().await.unwrap()[1].logged_out);
    assert!(store.set_install_auth("zed", None).await.unwrap());

    assert!(store.remove_install("echo").await.unwrap());
    assert!(!store.remove_install("echo").await.unwrap());
    let logged_out = InstallRecord {
        logged_out: true,
        ..zed
    };
    assert_eq!(store.installs().await.unwrap(), vec![logged_out]);

    // Replicas installing one name at once: exactly one records it.
    let claims = (0..8).map(|i| {
        let store = store.clone();
        async move {
            store
                .add_install(&install("race", "1.0.0", &format!("r{i}")))
                .await
                .unwrap()
        }
    });
    let won = futures::future::join_all(claims).await;
    assert_eq!(won.iter().filter(|w| **w).count(), 1, "{won:?}");
}
