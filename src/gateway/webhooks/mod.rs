//! Webhooks, the use case: subscriptions per tenant and their deliveries (`subscriptions`),
//! sending the outbox (`delivery`), and which addresses a delivery may go to (`reach`).

mod delivery;
pub mod reach;
mod subscriptions;

pub use subscriptions::{
    DeliveryPage, DeliveryView, NewWebhook, WebhookConfig, WebhookPatch, WebhookView, Webhooks,
};
