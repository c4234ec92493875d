//! Sans-IO HTTP/1.1 codec (being written).
