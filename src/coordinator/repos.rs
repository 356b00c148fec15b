//! The repositories of the roster (migration 0015): declarations an assignment's workspace
//! is cloned from. Not authority — no transition, no fence — but validated like everything
//! an operator sends, and never changed under an assignment that names one (a name, once
//! declared, keeps its source; another source is another name).

use super::error::{reject, AuthorityError, Category};
use super::rows::RowExt;
use super::store::Store;
use crate::protocol::repo::{RepoName, RepoSetup, RepoSource};

/// One declared repository.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Repository {
    pub name: RepoName,
    /// The host a path is on; `None` for a URL (any host fetches it).
    pub host_id: Option<String>,
    #[serde(flatten)]
    pub source: RepoSource,
    /// What a fresh workspace gets before its harness starts.
    pub setup: RepoSetup,
    pub setup_digest: String,
    pub created_at: String,
}

/// The setup columns of a row (`setup_copy`, `setup_commands`, `setup_timeout_s`),
/// checked as the wire checks them.
pub(crate) fn setup_of(
    r: &tokio_postgres::Row,
    op: &'static str,
) -> Result<RepoSetup, AuthorityError> {
    let (copy, commands, timeout): (Vec<String>, Vec<String>, i32) = (
        r.col("setup_copy")?,
        r.col("setup_commands")?,
        r.col("setup_timeout_s")?,
    );
    let timeout = u32::try_from(timeout).map_err(|_| AuthorityError::Invariant {
        op,
        detail: format!("setup timeout {timeout}"),
    })?;
    RepoSetup::parse(&copy, &commands, Some(timeout)).map_err(|e| AuthorityError::Invariant {
        op,
        detail: e.to_string(),
    })
}

impl Repository {
    fn from_row(r: &tokio_postgres::Row) -> Result<Self, AuthorityError> {
        let name: String = r.col("name")?;
        let (kind, source): (String, String) = (r.col("source_kind")?, r.col("source")?);
        let bad = |e: crate::protocol::repo::RepoError| AuthorityError::Invariant {
            op: "repository",
            detail: e.to_string(),
        };
        let setup = setup_of(r, "repository")?;
        Ok(Self {
            name: RepoName::parse(&name).map_err(bad)?,
            host_id: r.col("host_id")?,
            source: RepoSource::of(&kind, &source).map_err(bad)?,
            setup_digest: setup.digest(),
            setup,
            created_at: r.col("created_at")?,
        })
    }

    /// Whether a lane of `host_id` can clone it.
    pub fn reachable_from(&self, host_id: &str) -> bool {
        self.host_id.as_deref().is_none_or(|h| h == host_id)
    }
}

const SELECT: &str =
    "SELECT name, host_id, source_kind, source, setup_copy, setup_commands, setup_timeout_s, mosaic_ts(created_at) AS created_at FROM repositories";

impl Store {
    /// Declares `name`; declaring it again with the same source, host and setup is a no-op
    /// (the row is returned), with another is a conflict.
    pub async fn add_repository(
        &self,
        name: &RepoName,
        source: &RepoSource,
        host_id: Option<&str>,
        setup: &RepoSetup,
    ) -> Result<(Repository, bool), AuthorityError> {
        if let Err(e) = setup.fits(source) {
            return Err(reject("repo-add", Category::BadInput, e.to_string()));
        }
        if matches!(source, RepoSource::Path(_)) && host_id.is_none() {
            return Err(reject(
                "repo-add",
                Category::BadInput,
                "a repository path is a directory on one host: name it (--host)",
            ));
        }
        let c = self.pool.get().await?;
        let inserted = c
            .execute(
                "INSERT INTO repositories (name, host_id, source_kind, source, setup_copy, setup_commands, setup_timeout_s) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (name) DO NOTHING",
                &[&name.as_str(), &host_id, &source.kind(), &source.as_str(),
                  &setup.copy().iter().map(|c| c.as_str()).collect::<Vec<_>>(),
                  &setup.commands().iter().map(|c| c.as_str()).collect::<Vec<_>>(),
                  &(setup.timeout_s() as i32)],
            )
            .await?
            == 1;
        let row = c
            .query_one(&format!("{SELECT} WHERE name = $1"), &[&name.as_str()])
            .await?;
        let r = Repository::from_row(&row)?;
        if r.source != *source || r.host_id.as_deref() != host_id || r.setup != *setup {
            return Err(reject(
                "repo-add",
                Category::Conflict,
                format!(
                    "repository {} is already declared with another source, host or setup; a name keeps its declaration (declare another name)",
                    name.as_str()
                ),
            ));
        }
        Ok((r, inserted))
    }

    pub async fn repositories(&self) -> Result<Vec<Repository>, AuthorityError> {
        let c = self.pool.get().await?;
        c.query(&format!("{SELECT} ORDER BY name"), &[])
            .await?
            .iter()
            .map(Repository::from_row)
            .collect()
    }

    pub async fn repository(&self, name: &str) -> Result<Option<Repository>, AuthorityError> {
        let c = self.pool.get().await?;
        c.query_opt(&format!("{SELECT} WHERE name = $1"), &[&name])
            .await?
            .as_ref()
            .map(Repository::from_row)
            .transpose()
    }

    /// The repository an assignment works in, and the host its workspace is on (the
    /// host of its latest chain), if it has one.
    pub async fn workspace_of(
        &self,
        assignment_id: &str,
    ) -> Result<Option<(String, String)>, AuthorityError> {
        let c = self.pool.get().await?;
        c.query_opt(
            "SELECT a.repository, ln.host_id FROM assignments a \
             JOIN reservations r ON r.assignment_id = a.assignment_id \
             JOIN lane_incarnations li ON li.lane_incarnation_id = r.lane_incarnation_id \
             JOIN lanes ln ON ln.lane_id = li.lane_id \
             WHERE a.assignment_id = $1 AND a.repository IS NOT NULL ORDER BY r.created_at DESC LIMIT 1",
            &[&assignment_id],
        )
        .await?
        .map(|r| Ok((r.col("repository")?, r.col("host_id")?)))
        .transpose()
    }

    /// The recorded checkpoints (of one assignment, of one digest), oldest first: ids and
    /// digests only.
    pub async fn checkpoints(
        &self,
        assignment_id: Option<&str>,
        digest: Option<&str>,
    ) -> Result<Vec<serde_json::Value>, AuthorityError> {
        let c = self.pool.get().await?;
        let rows = c
            .query(
                "SELECT checkpoint_digest, commit_id, tree_id, repository, classification, retention_policy_digest, purpose, \
                        assignment_id, assignment_attempt_id, lane_incarnation_id, generation, host_id, termination_receipt, handoff_id, request_seq, \
                        mosaic_ts(created_at) AS created_at, base_commit_id, base_object, bundle_object, transfer_error, inputs_digest, \
                        EXISTS (SELECT 1 FROM checkpoint_objects o WHERE o.object_digest = bundle_object AND o.stored_at IS NOT NULL) AS stored \
                 FROM checkpoints WHERE ($1::text IS NULL OR assignment_id = $1) \
                   AND ($2::text IS NULL OR checkpoint_digest = $2) ORDER BY created_at, generation",
                &[&assignment_id, &digest],
            )
            .await?;
        rows.iter()
            .map(|r| {
                let text = |c: &str| r.col::<String>(c);
                Ok(serde_json::json!({
                    "checkpoint_digest": text("checkpoint_digest")?, "commit_id": text("commit_id")?,
                    "tree_id": text("tree_id")?, "repository": text("repository")?,
                    "classification": text("classification")?,
                    "retention_policy_digest": text("retention_policy_digest")?, "purpose": text("purpose")?,
                    "assignment_id": text("assignment_id")?, "assignment_attempt_id": text("assignment_attempt_id")?,
                    "lane_incarnation_id": text("lane_incarnation_id")?, "generation": r.col::<i64>("generation")?,
                    "host_id": text("host_id")?,
                    "termination_receipt": r.col::<Option<String>>("termination_receipt")?,
                    "handoff_id": r.col::<Option<String>>("handoff_id")?,
                    "request_seq": r.col::<Option<i32>>("request_seq")?,
                    "created_at": text("created_at")?,
                    "base_commit_id": r.col::<Option<String>>("base_commit_id")?,
                    "base_object": r.col::<Option<String>>("base_object")?,
                    "bundle_object": r.col::<Option<String>>("bundle_object")?,
                    "stored": r.col::<bool>("stored")?,
                    "transfer_error": r.col::<Option<String>>("transfer_error")?,
                    "inputs_digest": r.col::<Option<String>>("inputs_digest")?,
                }))
            })
            .collect()
    }
}
