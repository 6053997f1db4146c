"""What a step records and how DVC sees it: the policy's fingerprint, the DVC record of each step,
every stage's declared code and data, and the finished run as a DVC experiment."""
