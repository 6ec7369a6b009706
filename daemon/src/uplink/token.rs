//! The rig's credential for the broker.

use std::path::PathBuf;

use super::error::LinkError;

/// Where a token comes from: a file re-read at every connection and authentication challenge (a
/// rotated JWT is picked up without a restart), or a fixed one (the offline tools).
#[derive(Debug, Clone, Default)]
pub enum Token {
    #[default]
    None,
    Fixed(String),
    File(PathBuf),
}

impl Token {
    /// The token now; a file that cannot be read is an error that names it.
    pub fn current(&self) -> Result<Option<String>, LinkError> {
        match self {
            Token::None => Ok(None),
            Token::Fixed(t) => Ok(Some(t.clone())),
            Token::File(path) => crate::config::read_token(path)
                .map(Some)
                .map_err(|e| LinkError::Broker(format!("token file {e}"))),
        }
    }
}
