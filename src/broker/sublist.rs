//! The subscription index: a token trie with a bounded match cache.
