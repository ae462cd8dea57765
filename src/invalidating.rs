//! Where quota comes back, the over-limit cache must hear of it: a window store whose
//! refunds, and a trust ledger whose awards, invalidate it. They wrap the store the
//! refunds run on and the ledger events award to, so neither `refund` nor `trust` knows
//! the cache exists (it is the check path's), and nothing that gives quota back can forget
//! to tell it.

use std::sync::Arc;

use async_trait::async_trait;

use crate::check::over_limit::OverLimit;
use crate::store::{CheckOp, CheckOutcome, RefundOp, Refunded, StoreError, WindowStore};
use crate::trust::ledger::{Award, TrustLedger, TrustRead};

/// A window store whose successful refunds invalidate `cache`.
pub struct RefundsInvalidate {
    pub store: Arc<dyn WindowStore>,
    pub cache: Arc<OverLimit>,
}

#[async_trait]
impl WindowStore for RefundsInvalidate {
    async fn check(&self, op: &CheckOp) -> Result<CheckOutcome, StoreError> {
        self.store.check(op).await
    }

    async fn refund_keys(&self, op: &RefundOp) -> Result<Refunded, StoreError> {
        let refunded = self.store.refund_keys(op).await?;
        if refunded.any() {
            self.cache.invalidate();
        }
        Ok(refunded)
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.store.ping().await
    }

    async fn sync(&self) -> Result<(), StoreError> {
        self.store.sync().await
    }

    fn kind(&self) -> &'static str {
        self.store.kind()
    }
}

/// A trust ledger whose awards invalidate `cache` (points raise a limit's max).
pub struct AwardsInvalidate {
    pub ledger: Arc<dyn TrustLedger>,
    pub cache: Arc<OverLimit>,
}

#[async_trait]
impl TrustLedger for AwardsInvalidate {
    async fn read(&self, user_id: &str, mark_seen: bool) -> Result<TrustRead, StoreError> {
        self.ledger.read(user_id, mark_seen).await
    }

    async fn award(&self, award: &Award) -> Result<(), StoreError> {
        self.ledger.award(award).await?;
        self.cache.invalidate();
        Ok(())
    }

    async fn awards(&self, user_id: &str) -> Result<Vec<Award>, StoreError> {
        self.ledger.awards(user_id).await
    }

    fn kind(&self) -> &'static str {
        self.ledger.kind()
    }

    async fn sync(&self) -> Result<(), StoreError> {
        self.ledger.sync().await
    }
}
