//! The diesel view of the tables created by `migrations/{postgres,sqlite}`. One definition
//! serves both backends: the migrations keep the two schemas column for column alike.

diesel::table! {
    instances (instance_id) {
        instance_id -> Text,
        hostname -> Text,
        pid -> BigInt,
        version -> Text,
        capacity -> Integer,
        state -> Text,
        started_at_us -> BigInt,
        heartbeat_at_us -> BigInt,
        session_tag -> Nullable<Text>,
        labels -> Text,
    }
}

diesel::table! {
    services (service_id) {
        service_id -> Text,
        max_in_flight -> Integer,
        paused -> Bool,
        created_at_us -> BigInt,
        pin_label -> Nullable<Text>,
        exclude_label -> Nullable<Text>,
    }
}

diesel::table! {
    service_id_claims (service_id) {
        service_id -> Text,
        claimant -> Nullable<Text>,
        epoch -> BigInt,
        fast_expiry_us -> BigInt,
        slow_expiry_us -> BigInt,
        claimed_at_us -> Nullable<BigInt>,
        shard -> BigInt,
    }
}

diesel::table! {
    cluster_leases (name) {
        name -> Text,
        holder -> Nullable<Text>,
        epoch -> BigInt,
        expiry_us -> BigInt,
    }
}

diesel::table! {
    batches (seq) {
        seq -> BigInt,
        service_id -> Text,
        batch_id -> Text,
        serialized_batch -> Binary,
        created_at_us -> BigInt,
    }
}

diesel::table! {
    batch_statuses (seq) {
        seq -> BigInt,
        service_id -> Text,
        status -> Text,
        attempts -> Integer,
        submit_epoch -> Nullable<BigInt>,
        submitted_by -> Nullable<Text>,
        next_attempt_at_us -> BigInt,
        unknown_since_us -> Nullable<BigInt>,
        dlt_message -> Nullable<Text>,
        last_error -> Nullable<Text>,
        updated_at_us -> BigInt,
    }
}

diesel::table! {
    batch_events (event_id) {
        event_id -> BigInt,
        seq -> BigInt,
        old_status -> Nullable<Text>,
        new_status -> Text,
        epoch -> Nullable<BigInt>,
        instance_id -> Nullable<Text>,
        detail -> Nullable<Text>,
        at_us -> BigInt,
    }
}

diesel::joinable!(service_id_claims -> services (service_id));
diesel::joinable!(batches -> services (service_id));
diesel::joinable!(batch_statuses -> batches (seq));
diesel::joinable!(batch_events -> batches (seq));

diesel::allow_tables_to_appear_in_same_query!(
    instances,
    services,
    cluster_leases,
    service_id_claims,
    batches,
    batch_statuses,
    batch_events,
);
